"""An ordered hand-off from producers to one asynchronous reader: items in the order
put, then the end (or an error raised to the reader after the rest). A decoupled
request's leases travel in one (``LeaseStream``), and so do the responses a gRPC
stream call has encoded (its outbox)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Stream(Generic[T]):
    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._ended = False
        self._error: BaseException | None = None
        self._reader: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        """Dropped after the end."""
        if not self._ended:
            self._items.append(item)
            self._wake()

    def end(self, error: BaseException | None = None) -> None:
        """No more items; ``error``, if any, is raised to the reader after the rest."""
        if not self._ended:
            self._ended = True
            self._error = error
            self._wake()

    def __aiter__(self) -> Stream[T]:
        return self

    async def __anext__(self) -> T:
        """The next item. A reader cancelled while it waits takes nothing."""
        while not self._items:
            if self._ended:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopAsyncIteration
            self._reader = asyncio.get_running_loop().create_future()
            await self._reader
        item = self._items.popleft()
        self._taken()
        return item

    def _taken(self) -> None:
        """An item was taken (room for the next, where there is a limit)."""

    def _wake(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)
