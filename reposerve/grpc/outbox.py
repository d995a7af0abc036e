"""A ModelStreamInfer call's outbox: the responses of all its requests, encoded, on their
way to the one writer of the call.

It holds a few at most: a request's task waits for room (``room``) before it puts the
next, so a slow client slows its own requests and nothing buffers without bound.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Outbox(Generic[T]):
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._responses: deque[T] = deque()
        self._ended = False
        self._error: BaseException | None = None
        self._reader: asyncio.Future[None] | None = None
        self._on_room: list[Callable[[], None]] = []

    # -- the producers' side -------------------------------------------------------------

    def put(self, response: T) -> None:
        if not self._ended:
            self._responses.append(response)
            self._wake()

    @property
    def full(self) -> bool:
        return len(self._responses) >= self._limit

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

    def end(self, error: BaseException | None = None) -> None:
        """No more responses; ``error``, if any, is raised to the reader after the rest."""
        if not self._ended:
            self._ended = True
            self._error = error
            self._wake()

    # -- the writer's side ---------------------------------------------------------------

    def __aiter__(self) -> Outbox[T]:
        return self

    async def __anext__(self) -> T:
        while not self._responses:
            if self._ended:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopAsyncIteration
            self._reader = asyncio.get_running_loop().create_future()
            await self._reader
        response = self._responses.popleft()
        if self._on_room and not self.full:
            callbacks, self._on_room = self._on_room, []
            for callback in callbacks:
                callback()
        return response

    def _wake(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)
