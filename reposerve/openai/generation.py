"""A completion as generations of a repository model: the request each one sends, and the
text that comes back, cut where the client said to stop.

The request is Triton's generate extension (``FrontService.generate``): the prompt in the
model's text input, and the sampling settings where the model takes them, so that a
Triton vLLM- or TensorRT-LLM-style model serves unchanged: a JSON ``sampling_parameters``
input (vLLM's) gets them all; an input named after one (``max_tokens``, ``temperature``,
``top_p``, ``seed`` or ``random_seed``, ``stop`` or ``stop_words``, ``frequency_penalty``,
``presence_penalty``) gets that one; ``stream``, ``exclude_input_in_output`` and the
``return_num_*_tokens`` / ``return_finish_reason`` switches are set where declared; and a
model with none of these inputs gets each setting as a request parameter.

Each response's text output is the next piece of text. Token counts come from the model's
``num_input_tokens`` and ``num_output_tokens`` outputs when it has them (vLLM's); a
decoupled model that gives none counts a token per response that holds text. The server
enforces ``stop`` (the text ends before the first stop string, held back while it may be
the start of one) and ``max_tokens`` (by those counts), ending the generation in the
instance when either ends the text; ``finish_reason`` is then ``stop`` or ``length``, and
otherwise what the model's ``finish_reason`` output says, or ``stop``.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import msgspec
import numpy as np

from reposerve.answers import Answer, encoded
from reposerve.datatypes import NUMPY_DTYPES, element_count, unpack_bytes
from reposerve.errors import ReposerveError
from reposerve.front_service import FrontService
from reposerve.operations import OpenAIModel
from reposerve.protocol.openai import OpenAIRequestError
from reposerve.protocol.response import json_values

_encode = msgspec.json.Encoder().encode
# setting -> the inputs that take it, in the order they are looked for
_SETTING_INPUTS = {
    "max_tokens": ("max_tokens",),
    "temperature": ("temperature",),
    "top_p": ("top_p",),
    "seed": ("seed", "random_seed"),
    "frequency_penalty": ("frequency_penalty",),
    "presence_penalty": ("presence_penalty",),
    "stop": ("stop", "stop_words"),
}
_DRAINED = 8  # responses a model that was told the limit may send once it is reached
_SWITCHES = ("return_num_input_tokens", "return_num_output_tokens", "return_finish_reason")


class Settings(msgspec.Struct, frozen=True):
    """What a request asks of each of its generations."""

    max_tokens: int
    stop: list[str]
    stream: bool
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None


def generate_body(model: OpenAIModel, prompt: str, settings: Settings) -> bytes:
    """The generate-extension request of one generation of ``prompt``."""
    inputs = model.inputs
    body: dict[str, Any] = {model.input: prompt}
    if "stream" in inputs:  # stops the model cannot take are cut here, as the text comes
        knows_stops = "sampling_parameters" in inputs or "stop" in inputs
        body["stream"] = settings.stream or bool(settings.stop and not knows_stops)
    if "exclude_input_in_output" in inputs:  # echo is ours to add
        body["exclude_input_in_output"] = True
    for switch in _SWITCHES:
        if switch in inputs:
            body[switch] = True
    values = {
        key: getattr(settings, key)
        for key in _SETTING_INPUTS
        if getattr(settings, key) not in (None, [])
    }
    if "sampling_parameters" in inputs:
        body["sampling_parameters"] = _encode(values).decode()
        return _encode(body)
    for key, value in values.items():
        taker = next((name for name in _SETTING_INPUTS[key] if name in inputs), None)
        if taker is not None:
            body[taker] = _wrapped(value, inputs[taker]) if key == "seed" else value
        elif not isinstance(value, list):  # a parameter holds one value; stops stay ours
            body[key] = value
    return _encode(body)


def choice_seed(seed: int, index: int) -> int:
    """The seed of a request's choice ``index`` (of n): the request's plus the index, so
    that choices are drawn apart, wrapped into the API's signed 64 bits (``seed`` may be
    its largest), as vLLM and OpenAI take seeds."""
    return _wrapped(seed + index, "INT64")


def _wrapped(seed: int, datatype: str) -> int:
    """``seed`` as a value of the integer ``datatype`` of the input that takes it, wrapped
    modulo 2**bits (a negative seed to an unsigned input, a 64-bit one to a narrower)."""
    if not datatype.startswith(("INT", "UINT")):
        return seed
    limits = np.iinfo(NUMPY_DTYPES[datatype])
    low, span = int(limits.min), int(limits.max) - int(limits.min) + 1
    return (seed - low) % span + low


class Piece(msgspec.Struct, frozen=True):
    """What one response of the model says: ``data``, its text as UTF-8 (a character
    may be split between two responses, as byte-level tokens split them)."""

    data: bytes
    input_tokens: int | None
    output_tokens: int | None
    finish_reason: str | None


def read_piece(model: OpenAIModel, answer: Answer) -> Piece:
    data, input_tokens, output_tokens, finish = b"", None, None, None
    for name, tensor in answer.tensors:
        if name == model.output and tensor.datatype == "BYTES":
            data = b"".join(unpack_bytes(tensor.memory(), element_count(tensor.shape)))
        elif name in ("num_input_tokens", "num_output_tokens") and tensor.datatype != "BYTES":
            count = int(
                np.frombuffer(
                    tensor.memory(), NUMPY_DTYPES[tensor.datatype], element_count(tensor.shape)
                ).sum()
            )
            if name == "num_input_tokens":
                input_tokens = count
            else:
                output_tokens = count
        elif name == "finish_reason" and tensor.datatype == "BYTES":
            reasons = json_values(model.name, name, tensor)
            finish = str(reasons[0]) if reasons and reasons[0] else None
    return Piece(data, input_tokens, output_tokens, finish)


class Generation:
    """One choice of a completion: ``text()`` gives its text as it comes; then
    ``finish_reason`` and the token counts hold."""

    def __init__(
        self,
        service: FrontService,
        model: OpenAIModel,
        prompt: str,
        settings: Settings,
        index: int,
    ) -> None:
        self.index = index
        self.model_name = model.name
        self.finish_reason = "stop"
        self.prompt_tokens: int | None = None
        self.completion_tokens = 0
        self.counted = False  # the model reported its output tokens
        self._service = service
        self._model = model
        self._settings = settings
        self._body = generate_body(model, prompt, settings)

    @property
    def counts_known(self) -> bool:
        return self.prompt_tokens is not None and self.counted

    async def text(self) -> AsyncGenerator[str, None]:
        """The text, piece by piece (none empty); closing this ends the generation. When
        a stop string or the token limit ends the text, a model that was given that limit
        is left to end on its own (it is about to: a few more responses, let go, so that
        its request ends as a success); any other is ended in the instance at once."""
        model, settings = self._model, self._settings
        answers = await self._service.generate(model.name, None, self._body)
        scanner = StopScanner(settings.stop)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        ended: str | None = None  # what ended the text: "stop" or "length"
        left = _DRAINED  # responses a model that knows the limit may still send
        async with contextlib.aclosing(encoded(answers, lambda a: read_piece(model, a))) as pieces:
            try:
                async for piece in pieces:
                    if ended is not None:
                        left -= 1
                        if left <= 0:
                            return  # it does not end as it should: ended here
                        continue
                    self._count(piece)
                    ready = scanner.feed(decoder.decode(piece.data))
                    if ready:
                        yield ready
                    if piece.finish_reason is not None:  # the model's word, when it has one
                        self.finish_reason = "length" if piece.finish_reason == "length" else "stop"
                    if scanner.stopped:
                        ended = self.finish_reason = "stop"
                    elif self.completion_tokens >= settings.max_tokens:
                        ended = "length" if piece.finish_reason is None else self.finish_reason
                        self.finish_reason = ended
                        if scanner.held:  # a character cut in two by the limit is left out
                            yield scanner.held
                    if ended is not None and not self._model_knows(ended):
                        return
            except ReposerveError:
                if ended is None:
                    raise
                return  # the text was whole: what failed after it is not the client's
        if ended is None:
            rest = scanner.feed(decoder.decode(b"", final=True))
            if scanner.stopped:
                self.finish_reason = "stop"
            else:
                rest += scanner.held
            if rest:
                yield rest

    def _model_knows(self, limit: str) -> bool:
        """Whether the model was given the limit that ended the text as text (and so ends
        too): a stop string through vLLM's sampling_parameters or a ``stop`` input (a
        TensorRT-LLM ``stop_words`` matches tokens, which may not end where text does)."""
        inputs = self._model.inputs
        takers = ("stop",) if limit == "stop" else _SETTING_INPUTS["max_tokens"]
        return "sampling_parameters" in inputs or any(name in inputs for name in takers)

    def _count(self, piece: Piece) -> None:
        if piece.input_tokens is not None and self.prompt_tokens is None:
            self.prompt_tokens = piece.input_tokens
        if piece.output_tokens is not None:
            self.counted = True
            self.completion_tokens += piece.output_tokens
        elif not self.counted and self._model.decoupled and piece.data:
            self.completion_tokens += 1


class StopScanner:
    """Text as it comes, let out up to the first stop string: ``feed`` gives what may be
    sent now; the end of the text that may be the start of a stop string is ``held``
    until more text shows whether it is. Once a stop string is found, ``stopped``."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        held = self.held + text
        found = [at for at in (held.find(stop) for stop in self._stops) if at >= 0]
        if found:
            self.stopped, self.held = True, ""
            return held[: min(found)]
        keep = self._stop_prefix(held)
        self.held = held[len(held) - keep :]
        return held[: len(held) - keep]

    def _stop_prefix(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest


async def merged(
    generations: Sequence[Generation],
) -> AsyncGenerator[tuple[Generation, str | None], None]:
    """The text of every generation as it comes, run side by side: (generation, piece),
    and (generation, None) when it ends. The first failure ends all of them and raises;
    closing this ends those still running. A client that reads slowly holds them back:
    a few pieces each wait, no more."""
    queue: asyncio.Queue[tuple[Generation, str | None] | BaseException] = asyncio.Queue(
        4 * len(generations)
    )

    async def run(generation: Generation) -> None:
        try:
            async with contextlib.aclosing(generation.text()) as pieces:
                async for piece in pieces:
                    await queue.put((generation, piece))
            await queue.put((generation, None))
        except BaseException as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # this side is being closed
                raise
            if not isinstance(exc, Exception):  # a cancellation from inside the generation
                exc = ReposerveError(
                    f"model '{generation.model_name}': its generation was cancelled"
                )
            await queue.put(exc)

    tasks = [asyncio.ensure_future(run(generation)) for generation in generations]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item[1] is None:
                running -= 1
            yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def check_kind(model: OpenAIModel, route: str, kinds: tuple[str, ...]) -> None:
    """OpenAIRequestError unless ``model`` serves ``route``."""
    if model.kind not in kinds:
        raise OpenAIRequestError(
            f"model '{model.name}' is a {model.kind} model, which {route} does not serve "
            f"(it serves {' or '.join(kinds)} models)",
            "model",
        )
