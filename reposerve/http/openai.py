"""The OpenAI-compatible routes: ``GET /v1/models[/{model}]``, ``POST /v1/chat/completions``,
``/v1/completions`` and ``/v1/embeddings``, the same under ``/openai/v1`` (KServe's).

Each request names a repository model whose config opts in (``[openai]``); its errors
answer in the API's shape, ``{"error": {"message", "type", "param", "code"}}``, with
``x-should-retry: false`` on every error but a 503 or 408, where a retry would only run
the model again or be refused again (the SDKs retry 5xx unless told not to). With
``stream`` the answer is Server-Sent Events, one chunk per piece of text, then the
finish, the usage when ``stream_options.include_usage`` asks, and ``data: [DONE]``; an
error before the first piece gets its status, one after it is the stream's last event.
A client that disconnects ends its generations in the instances. API keys
(``--openai-api-key``), when set, are required here as ``Authorization: Bearer KEY``;
``--http-restricted-api`` rules for ``inference`` (and ``metadata``, for the model
list) apply too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from reposerve.config.chat_templates import TemplateError, render_chat
from reposerve.errors import ErrorKind, ReposerveError
from reposerve.front_service import FrontService
from reposerve.http.access import AccessPolicy
from reposerve.http.errors import STATUS, HttpError
from reposerve.http.generate import EVENT_STREAM, before, send_json
from reposerve.http.infer import Disconnected, InferEndpoint, wait_for_disconnect
from reposerve.openai.embeddings import embed
from reposerve.openai.generation import Generation, Settings, check_kind, choice_seed, merged
from reposerve.operations import OpenAIModel, OpenAIModelsRequest
from reposerve.protocol.openai import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    ErrorDetail,
    ErrorDocument,
    ModelCard,
    ModelList,
    OpenAIRequestError,
    Usage,
    decode_request,
    encode,
    message_text,
)
from reposerve.service import DECODE_IN_THREAD

log = logging.getLogger("reposerve.http")
T = TypeVar("T")

PREFIXES = ("/v1", "/openai/v1")
_NO_RETRY = (b"x-should-retry", b"false")
# the last event and the end of the body in one write, so that a client that stops
# reading at [DONE] (the SDKs do) finds the body ended and keeps its connection
_DONE = {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}
# status -> the API's error type
_TYPES = {403: "permission_error", 408: "timeout", 501: "invalid_request_error"}
_CODES = {
    ErrorKind.NOT_FOUND: "model_not_found",
    ErrorKind.UNAVAILABLE: "service_unavailable",
    ErrorKind.UNSUPPORTED: "unsupported",
    ErrorKind.INTERNAL: "internal_error",
}


class Unauthorized(ReposerveError):
    """No API key, or not one of the server's (401)."""

    kind = ErrorKind.FORBIDDEN


class OpenAIEndpoint(InferEndpoint):
    """One route; ``keys``: the API keys that may call it (none: no key needed)."""

    def __init__(
        self,
        service: FrontService,
        policy: AccessPolicy,
        max_body: int,
        keys: frozenset[str],
        route: str,
    ) -> None:
        super().__init__(service, policy, max_body)
        self._keys = keys
        self._handle: Callable[[bytes, asyncio.Future, Send], Awaitable[None]] = {
            "chat/completions": self._chat,
            "completions": self._completions,
            "embeddings": self._embeddings,
        }.get(route, self._models)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watching: asyncio.Future | None = None
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            self._check_key(scope)
            if scope["method"] == "GET":
                if self._policy.guards("metadata"):
                    self._policy.check("metadata", Request(scope))
                body = scope["path_params"].get("model", "").encode()
            else:
                body, _, _ = await self.read(scope, receive)
            watching = asyncio.ensure_future(wait_for_disconnect(receive))
            await self._handle(body, watching, sending)
        except Disconnected:
            return
        except Exception as exc:
            if started:  # too late for a status: the client has what was sent
                log.exception("error after the response began on %s", scope["path"])
                return
            status, content, headers = error_reply(exc, scope)
            await send_json(send, status, content, headers)
        finally:
            if watching is not None:
                watching.cancel()

    def _check_key(self, scope: Scope) -> None:
        if not self._keys:
            return
        given = dict(scope["headers"]).get(b"authorization", b"").decode(errors="replace")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not any(
            hmac.compare_digest(key.strip().encode(), known.encode()) for known in self._keys
        ):
            raise Unauthorized(
                "this server needs an API key: send Authorization: Bearer KEY with one of "
                "the keys it was started with (--openai-api-key)"
                if not key
                else "the API key given is not one of this server's (--openai-api-key)"
            )

    async def _model(self, name: str, route: str, kinds: tuple[str, ...]) -> OpenAIModel:
        (model,) = await self._service.perform(OpenAIModelsRequest(name))
        check_kind(model, route, kinds)
        return model

    # -- the routes ----------------------------------------------------------------------

    async def _models(self, name: bytes, watching: asyncio.Future, send: Send) -> None:
        """GET /v1/models (``name`` empty) or /v1/models/{name}."""
        models = await self._service.perform(OpenAIModelsRequest())  # none loaded for being asked
        if name:
            wanted = name.decode()
            found = [model for model in models if model.name == wanted]
            if not found:
                raise OpenAIRequestError(
                    f"The model '{wanted}' does not exist on the OpenAI-compatible routes "
                    "(GET /v1/models lists them)",
                    "model",
                    ErrorKind.NOT_FOUND,
                )
            await send_json(send, 200, encode(ModelCard(found[0].name, found[0].created)))
            return
        cards = [ModelCard(model.name, model.created) for model in models]
        await send_json(send, 200, encode(ModelList(cards)))

    async def _chat(self, body: bytes, watching: asyncio.Future, send: Send) -> None:
        request = await _off_the_loop(body, decode_request, body, ChatRequest)
        model = await self._model(request.model, "/v1/chat/completions", ("chat",))
        prompt = await _off_the_loop(body, _prompt, model, request)
        choices = self._generations(model, [prompt], request, request.token_limit)
        reply = _Reply("chatcmpl", "chat.completion", request.model, request.include_usage)
        if request.stream:
            await _stream(reply, choices, request.choices, watching, send, chat=True)
            return
        texts = await before(watching, _collect(choices))
        documents = [
            {
                "index": choice.index,
                "message": {"role": "assistant", "content": text},
                "finish_reason": choice.finish_reason,
                "logprobs": None,
            }
            for choice, text in zip(choices, texts, strict=True)
        ]
        await send_json(send, 200, reply.whole(documents, _usage(choices, request.choices)))

    async def _completions(self, body: bytes, watching: asyncio.Future, send: Send) -> None:
        request = await _off_the_loop(body, decode_request, body, CompletionRequest)
        model = await self._model(request.model, "/v1/completions", ("completion", "chat"))
        prompts = request.prompts
        choices = self._generations(model, prompts, request, request.token_limit)
        echoes = [
            prompts[choice.index // request.choices] if request.echo else "" for choice in choices
        ]
        reply = _Reply("cmpl", "text_completion", request.model, request.include_usage)
        if request.stream:
            await _stream(
                reply, choices, request.choices, watching, send, chat=False, echoes=echoes
            )
            return
        texts = await before(watching, _collect(choices))
        documents = [
            {
                "index": choice.index,
                "text": echo + text,
                "finish_reason": choice.finish_reason,
                "logprobs": None,
            }
            for choice, text, echo in zip(choices, texts, echoes, strict=True)
        ]
        await send_json(send, 200, reply.whole(documents, _usage(choices, request.choices)))

    async def _embeddings(self, body: bytes, watching: asyncio.Future, send: Send) -> None:
        request = await _off_the_loop(body, decode_request, body, EmbeddingRequest)
        model = await self._model(request.model, "/v1/embeddings", ("embedding",))
        as_base64 = request.encoding_format == "base64"
        found = await before(watching, embed(self._service, model, request.texts, as_base64))
        document: dict[str, Any] = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": item.vector}
                for index, item in enumerate(found)
            ],
            "model": request.model,
        }
        tokens = [item.tokens for item in found]
        if all(count is not None for count in tokens):
            total = sum(count for count in tokens if count is not None)
            document["usage"] = {"prompt_tokens": total, "total_tokens": total}
        await send_json(send, 200, encode(document))

    def _generations(
        self,
        model: OpenAIModel,
        prompts: list[str],
        request: ChatRequest | CompletionRequest,
        limit: int | None,
    ) -> list[Generation]:
        """``request.choices`` (n) generations of each prompt; choice ``i * n + j`` is prompt i's
        j-th (seeds differ between a prompt's choices, so they are not all one text)."""
        choices = []
        for number, prompt in enumerate(prompts):
            for draw in range(request.choices):
                seed = choice_seed(request.seed, draw) if request.seed is not None else None
                settings = Settings(
                    max_tokens=limit or model.max_tokens,
                    stop=request.stops,
                    stream=bool(request.stream),  # a bool once decoded (None read as False)
                    temperature=request.temperature,
                    top_p=request.top_p,
                    seed=seed,
                    frequency_penalty=request.frequency_penalty,
                    presence_penalty=request.presence_penalty,
                )
                index = number * request.choices + draw
                choices.append(Generation(self._service, model, prompt, settings, index))
        return choices


async def _off_the_loop(body: bytes, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``, in a worker thread when ``body`` is large enough that walking it
    (decoding, rendering its messages) would stall every other request."""
    if len(body) < DECODE_IN_THREAD:
        return work(*args)
    return await asyncio.to_thread(work, *args)


def _prompt(model: OpenAIModel, request: ChatRequest) -> str:
    assert model.chat_template is not None  # a chat model's load reads it
    try:
        return render_chat(model.chat_template, message_text(request.messages), request.tools)
    except TemplateError as exc:
        raise OpenAIRequestError(
            f"model '{model.name}': its chat template cannot render these messages: {exc}",
            "messages",
        ) from None


class _Reply:
    """What every document of one answer shares: its id, object type, time and model."""

    def __init__(self, prefix: str, kind: str, model: str, include_usage: bool) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.kind = kind
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def whole(self, choices: list[dict], usage: Usage | None) -> bytes:
        return encode(
            {
                "id": self.id,
                "object": self.kind,
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": usage,
            }
        )

    def chunk(self, choices: list[dict], usage: Usage | None = None) -> dict:
        document: dict[str, Any] = {
            "id": self.id,
            "object": self.kind if self.kind == "text_completion" else "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            document["usage"] = usage
        return _event(encode(document))


async def _collect(choices: Sequence[Generation]) -> list[str]:
    texts: dict[int, list[str]] = {choice.index: [] for choice in choices}
    async with contextlib.aclosing(merged(choices)) as pieces:
        async for choice, piece in pieces:
            if piece is not None:
                texts[choice.index].append(piece)
    return ["".join(texts[choice.index]) for choice in choices]


async def _stream(
    reply: _Reply,
    choices: Sequence[Generation],
    per_prompt: int,
    watching: asyncio.Future,
    send: Send,
    chat: bool,
    echoes: Sequence[str] = (),
) -> None:
    """The choices' text as chunks (``per_prompt`` of them for each prompt). The first
    piece (or the end) comes before the 200, so that a request the model refuses gets its
    status."""
    pieces = merged(choices)
    async with contextlib.aclosing(pieces):
        first = await before(watching, anext(pieces, None))
        await send({"type": "http.response.start", "status": 200, "headers": EVENT_STREAM})
        opening = []
        for choice in choices:
            echo = echoes[choice.index] if echoes else ""
            if chat:
                opening.append(_delta(choice, {"role": "assistant", "content": ""}, None))
            elif echo:
                opening.append({"index": choice.index, "text": echo, "finish_reason": None,
                                "logprobs": None})  # fmt: skip
        try:
            for document in opening:  # a chunk each, as the API sends them
                await send(reply.chunk([document]))
            await before(watching, _send_pieces(reply, first, pieces, send, chat))
            if reply.include_usage:
                await send(reply.chunk([], _usage(choices, per_prompt)))
        except OSError:  # the client has gone
            return
        except Disconnected:
            raise
        except Exception as exc:  # the 200 has gone: the error is the last event
            if not isinstance(exc, ReposerveError):
                log.exception("unhandled error while streaming")
            await send(_event(_error_document(exc)))
        await send(_DONE)


async def _send_pieces(
    reply: _Reply,
    first: tuple[Generation, str | None] | None,
    pieces: AsyncIterator[tuple[Generation, str | None]],
    send: Send,
    chat: bool,
) -> None:
    item = first
    while item is not None:
        choice, piece = item
        if chat:
            delta = {"content": piece} if piece is not None else {}
            document = _delta(choice, delta, None if piece is not None else choice.finish_reason)
        else:
            document = {
                "index": choice.index,
                "text": piece or "",
                "finish_reason": None if piece is not None else choice.finish_reason,
                "logprobs": None,
            }
        await send(reply.chunk([document]))
        item = await anext(pieces, None)


def _delta(choice: Generation, delta: dict, finish_reason: str | None) -> dict:
    return {"index": choice.index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}


def _usage(choices: Sequence[Generation], per_prompt: int) -> Usage | None:
    """The token counts when the model reported them (each prompt counted once)."""
    if not all(choice.counts_known for choice in choices):
        return None
    prompt = sum(choice.prompt_tokens or 0 for choice in choices[::per_prompt])
    completion = sum(choice.completion_tokens for choice in choices)
    return Usage(prompt, completion, prompt + completion)


def _event(document: bytes) -> dict:
    return {"type": "http.response.body", "body": b"data: " + document + b"\n\n", "more_body": True}


def _error_document(exc: Exception) -> bytes:
    status = _status(exc)
    param = exc.param if isinstance(exc, OpenAIRequestError) else None
    code = "invalid_api_key" if isinstance(exc, Unauthorized) else None
    if code is None and isinstance(exc, ReposerveError):
        code = _CODES.get(exc.kind)
    message = exc.message if isinstance(exc, ReposerveError | HttpError) else str(exc)
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    detail = ErrorDetail(message, kind, param, code)
    return encode(ErrorDocument(detail))


def _status(exc: Exception) -> int:
    if isinstance(exc, Unauthorized):
        return 401
    if isinstance(exc, HttpError):
        return exc.status
    if isinstance(exc, ReposerveError):
        return STATUS[exc.kind]
    return 500


def error_reply(exc: Exception, scope: Scope) -> tuple[int, bytes, tuple[tuple[bytes, bytes], ...]]:
    """An error as the API answers it: status, body and headers."""
    if not isinstance(exc, ReposerveError | HttpError):
        log.exception("unhandled error on %s", scope["path"])
        exc = ReposerveError(f"internal error: {type(exc).__name__}: {exc}")
    status = _status(exc)
    headers: tuple[tuple[bytes, bytes], ...] = exc.headers if isinstance(exc, HttpError) else ()
    if status not in (408, 503):
        headers = (*headers, _NO_RETRY)
    if status == 401:
        headers = (*headers, (b"www-authenticate", b'Bearer realm="reposerve"'))
    return status, _error_document(exc), headers


def openai_routes(
    service: FrontService, policy: AccessPolicy, max_body: int, keys: frozenset[str]
) -> list[tuple[str, OpenAIEndpoint, str]]:
    """(path, endpoint, method) of every route, under each prefix."""
    table = [
        ("models", "GET"),
        ("models/{model:path}", "GET"),
        ("chat/completions", "POST"),
        ("completions", "POST"),
        ("embeddings", "POST"),
    ]
    return [
        (f"{prefix}/{path}", OpenAIEndpoint(service, policy, max_body, keys, path), method)
        for prefix in PREFIXES
        for path, method in table
    ]
