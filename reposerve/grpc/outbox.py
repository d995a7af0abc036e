"""A ModelStreamInfer call's outbox: the responses of all its requests, encoded, on their
way to the one writer of the call.

It holds a few at most: a request's task waits for room (``room``) before it puts the
next, so a slow client slows its own requests and nothing buffers without bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from reposerve.scheduler.stream import Stream

T = TypeVar("T")


class Outbox(Stream[T]):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit
        self._on_room: list[Callable[[], None]] = []

    @property
    def full(self) -> bool:
        return len(self._items) >= self._limit

    def when_room(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the outbox is not full (now, if it is not)."""
        if self.full:
            self._on_room.append(callback)
        else:
            callback()

    async def room(self) -> None:
        """Wait until the outbox is not full."""
        if self.full:
            ready = asyncio.get_running_loop().create_future()
            self.when_room(lambda: ready.done() or ready.set_result(None))
            await ready

    def _taken(self) -> None:
        if self._on_room and not self.full:
            callbacks, self._on_room = self._on_room, []
            for callback in callbacks:
                callback()
