"""What a front calls (``FrontService``): ``reposerve.service.InferenceService`` in the
server's own process, or ``reposerve.fronts.remote.RemoteService`` in a front worker's.

Inference has a method of its own for each shape of request (its hot path); every other
operation is one typed value (``reposerve.operations``) given to ``perform``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from reposerve.answers import Answer, Answers
from reposerve.operations import Operation
from reposerve.protocol.request import Body, Raw

R = TypeVar("R")


class FrontService(Protocol):
    async def perform(self, operation: Operation[R]) -> R: ...

    async def infer(
        self, name: str, version: str | None, body: Body, header_length: int | None
    ) -> Answer: ...

    async def infer_parts(
        self, name: str, version: str | None, header: dict[str, Any], raws: Sequence[Raw]
    ) -> Answer: ...

    async def generate(
        self, name: str, version: str | None, body: bytes | bytearray
    ) -> Answers: ...

    async def stream_parts(
        self, name: str, version: str | None, header: dict[str, Any], raws: Sequence[Raw]
    ) -> Answers: ...
