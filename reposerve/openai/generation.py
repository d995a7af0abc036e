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
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
import numpy as np

from reposerve.answers import Answer, encoded
from reposerve.datatypes import NUMPY_DTYPES, element_count, unpack_bytes
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
    if "stream" in inputs:
        body["stream"] = settings.stream
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
            body[taker] = value
        elif not isinstance(value, list):  # a parameter holds one value; stops stay ours
            body[key] = value
    return _encode(body)


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
            data = b"".join(unpack_bytes(tensor.raw, element_count(tensor.shape)))
        elif name in ("num_input_tokens", "num_output_tokens") and tensor.datatype != "BYTES":
            count = int(
                np.frombuffer(
                    tensor.raw, NUMPY_DTYPES[tensor.datatype], element_count(tensor.shape)
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

    async def text(self) -> AsyncIterator[str]:
        """The text, piece by piece (none empty); closing this ends the generation."""
        model, settings = self._model, self._settings
        answers = await self._service.generate(model.name, None, self._body)
        held = ""  # text that may be the start of a stop string
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        async with contextlib.aclosing(encoded(answers, lambda a: read_piece(model, a))) as pieces:
            async for piece in pieces:
                self._count(piece)
                held += decoder.decode(piece.data)
                cut = _first_stop(held, settings.stop)
                if cut is not None:
                    if held[:cut]:
                        yield held[:cut]
                    self.finish_reason = "stop"
                    return
                keep = _stop_prefix(held, settings.stop)
                if len(held) > keep:
                    yield held[: len(held) - keep]
                    held = held[len(held) - keep :]
                if self.completion_tokens >= settings.max_tokens:
                    self.finish_reason = "length"
                    if held:  # a character cut in two by the limit is left out
                        yield held
                    return
                if piece.finish_reason is not None:
                    self.finish_reason = "length" if piece.finish_reason == "length" else "stop"
        held += decoder.decode(b"", final=True)
        if held:
            yield held

    def _count(self, piece: Piece) -> None:
        if piece.input_tokens is not None and self.prompt_tokens is None:
            self.prompt_tokens = piece.input_tokens
        if piece.output_tokens is not None:
            self.counted = True
            self.completion_tokens += piece.output_tokens
        elif not self.counted and self._model.decoupled and piece.data:
            self.completion_tokens += 1


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    found = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    return min(found) if found else None


def _stop_prefix(text: str, stops: Sequence[str]) -> int:
    """The length of the longest end of ``text`` that begins some stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


async def merged(generations: Sequence[Generation]) -> AsyncIterator[tuple[Generation, str | None]]:
    """The text of every generation as it comes, run side by side: (generation, piece),
    and (generation, None) when it ends. The first failure ends all of them and raises;
    closing this ends those still running."""
    queue: asyncio.Queue[tuple[Generation, str | None] | BaseException] = asyncio.Queue()

    async def run(generation: Generation) -> None:
        try:
            async with contextlib.aclosing(generation.text()) as pieces:
                async for piece in pieces:
                    queue.put_nowait((generation, piece))
            queue.put_nowait((generation, None))
        except Exception as exc:
            queue.put_nowait(exc)

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
