"""A ModelStreamInfer call's outbox: the responses of all its requests, encoded, on their
way to the one writer of the call.

It holds a few at most: a request's task waits for room (``room``) before it puts the
next, so a slow client slows its own requests and nothing buffers without bound.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from reposerve.scheduler.stream import Stream

T = TypeVar("T")


class Outbox(Stream[T]):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit
        self._waiting: list[asyncio.Future[None]] = []

    async def room(self) -> None:
        """Wait until the outbox is not full."""
        if len(self._items) >= self._limit:
            ready = asyncio.get_running_loop().create_future()
            self._waiting.append(ready)
            await ready

    def _taken(self) -> None:
        if self._waiting and len(self._items) < self._limit:
            waiting, self._waiting = self._waiting, []
            for ready in waiting:
                if not ready.done():
                    ready.set_result(None)
