"""The OpenAI API's request and response documents (chat completions, completions,
embeddings, models), as the ``openai`` SDKs send and read them.

Requests are decoded into Structs that ignore fields they do not name (the API grows; an
SDK sends what it knows), with every value checked: a wrong type or a value out of range
is an ``OpenAIRequestError`` naming the field (``param``), as the API's errors do. What
reposerve cannot honour (log probabilities, token-id prompts, a JSON response format) is
refused by name rather than ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from reposerve.errors import ErrorKind, ProtocolError

MAX_CHOICES = 16  # n: each choice is a generation of its own
MAX_STOPS = 4  # the API's limit on stop strings
MAX_EMBEDDING_INPUTS = 2048  # the API's limit on texts in one embeddings request
MAX_GENERATIONS = 64  # prompts x n: the generations one request may start
MAX_STOP_LENGTH = 1024  # characters of one stop string (held back while it may begin)
# The seeds the API takes: a signed 64-bit integer, as OpenAI's API reference and vLLM's
# protocol (ge/le of torch.long) bound them.
Seed = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]


class OpenAIRequestError(ProtocolError):
    """A request the API refuses: ``param`` names the field at fault (None: the body)."""

    def __init__(
        self, message: str, param: str | None = None, kind: ErrorKind | None = None
    ) -> None:
        super().__init__(message, kind)
        self.param = param


class _Request(msgspec.Struct, kw_only=True):
    model: Annotated[str, Meta(min_length=1)]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = False


class _Generating(_Request, kw_only=True):
    """What chat completions and completions share. A field the API lets be ``null``
    (the SDKs send it for a None given) is read as absent."""

    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = 1
    stop: str | list[str] | None = None
    seed: Seed | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None

    def __post_init__(self) -> None:
        self.stream = bool(self.stream)
        self.n = self.n or 1

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)


class ChatRequest(_Generating, kw_only=True):
    messages: Annotated[list[dict[str, Any]], Meta(min_length=1)]
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    logprobs: bool | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Generating, kw_only=True):
    prompt: str | list[str]
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else self.prompt


class EmbeddingRequest(_Request, kw_only=True):
    input: str | list[str]
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = None

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


R = TypeVar("R", bound=_Request)
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def decode_request(body: bytes, kind: type[R]) -> R:
    """``body`` as a ``kind``, checked; OpenAIRequestError naming what is wrong."""
    try:
        request = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        found = _PATH.search(text) or _MISSING.search(text)
        param = found.group(1) if found else None
        raise OpenAIRequestError(
            f"invalid request: {_PATH.sub('', text)}" + (f" (at '{param}')" if param else ""),
            param or None,
        ) from None
    except msgspec.DecodeError as exc:
        raise OpenAIRequestError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise OpenAIRequestError("the request body nests too deeply") from None
    _check(request)
    return request


def _check(request: _Request) -> None:
    stops = request.stops if isinstance(request, _Generating) else []
    if len(stops) > MAX_STOPS or any(not 0 < len(stop) <= MAX_STOP_LENGTH for stop in stops):
        raise OpenAIRequestError(
            f"stop: at most {MAX_STOPS} strings, each of 1 to {MAX_STOP_LENGTH} characters",
            "stop",
        )
    if isinstance(request, ChatRequest):
        if request.logprobs:
            raise _unsupported("logprobs", "log probabilities")
        kind = (request.response_format or {}).get("type", "text")
        if kind != "text":
            raise _unsupported("response_format", f"response_format {kind!r} (only 'text')")
    elif isinstance(request, CompletionRequest):
        if request.logprobs is not None:
            raise _unsupported("logprobs", "log probabilities")
        if request.suffix:
            raise _unsupported("suffix", "a suffix (insertion)")
        if request.best_of not in (None, request.n):
            raise _unsupported("best_of", "best_of other than n")
        if not request.prompts:
            raise OpenAIRequestError("prompt: give at least one prompt", "prompt")
        if len(request.prompts) * request.choices > MAX_GENERATIONS:
            raise OpenAIRequestError(
                f"prompt: {len(request.prompts)} prompts x n = {request.choices} would start "
                f"{len(request.prompts) * request.choices} generations; at most "
                f"{MAX_GENERATIONS} in one request",
                "prompt",
            )
    elif isinstance(request, EmbeddingRequest):
        if request.dimensions is not None:
            raise _unsupported("dimensions", "dimensions (the model's own size is served)")
        if not request.texts or len(request.texts) > MAX_EMBEDDING_INPUTS:
            raise OpenAIRequestError(
                f"input: give 1 to {MAX_EMBEDDING_INPUTS} texts (got {len(request.texts)})",
                "input",
            )
        if any(not text for text in request.texts):
            raise OpenAIRequestError("input: texts may not be empty", "input")


def _unsupported(param: str, what: str) -> OpenAIRequestError:
    return OpenAIRequestError(f"{param}: {what} is not supported by this server", param)


def message_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as chat templates take them: each ``content`` as text (the text parts
    of a list of parts, joined by newlines); OpenAIRequestError for other parts."""
    rendered: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message.get("role"), str):
            raise OpenAIRequestError(f"{where}.role: a message names its role", f"{where}.role")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for number, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise OpenAIRequestError(
                        f"{where}.content[{number}]: only text parts are supported (got {kind!r})",
                        f"{where}.content",
                    )
                if not isinstance(part.get("text"), str):
                    raise OpenAIRequestError(
                        f"{where}.content[{number}].text: a text part holds a string",
                        f"{where}.content",
                    )
                texts.append(part["text"])
            message = {**message, "content": "\n".join(texts)}
        elif content is not None and not isinstance(content, str):
            raise OpenAIRequestError(
                f"{where}.content: a string or a list of text parts", f"{where}.content"
            )
        rendered.append(message)
    return rendered


# -- responses -----------------------------------------------------------------------------


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "reposerve"
    object: str = "model"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorDocument(msgspec.Struct):
    error: ErrorDetail


encode = msgspec.json.Encoder().encode
