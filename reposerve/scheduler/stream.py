"""The responses of one streamed request, between the scheduler and a front.

The scheduler puts each response as the front's ``finish`` made it (encoded bytes or a
message: the tensors it was made from are gone by then); the front iterates them. A
stream holds a few at most: when it is full the scheduler holds back the instance's next
response (``Resume``) until the front has taken one, so a slow client slows its own
generation and never makes anything buffer without bound.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# Responses a stream holds before its producer waits: enough to cover one trip through
# the front, few enough that a stalled client costs little memory.
STREAM_BUFFER = 4


class ResponseStream(Generic[T]):
    def __init__(self, limit: int = STREAM_BUFFER) -> None:
        self._limit = limit
        self._responses: deque[tuple[T, bool]] = deque()  # each with whether it is the last
        self._ended = False
        self._error: BaseException | None = None
        self._reader: asyncio.Future[None] | None = None
        self._on_room: list[Callable[[], None]] = []
        self.cancelled = False
        self.on_cancel: Callable[[], None] | None = None  # the scheduler's, once queued
        # The response last taken was marked final by the model (a decoupled model's last
        # response may carry outputs, or be a flag alone that puts nothing here).
        self.took_final = False

    # -- the scheduler's side ------------------------------------------------------------

    def put(self, response: T, final: bool = False) -> None:
        """``final``: the model marked it its request's last response."""
        if not self.cancelled and not self._ended:
            self._responses.append((response, final))
            self._wake()

    @property
    def full(self) -> bool:
        return not self.cancelled and len(self._responses) >= self._limit

    def when_room(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the stream is not full (now, if it is not)."""
        if self.full:
            self._on_room.append(callback)
        else:
            callback()

    async def room(self) -> None:
        """Wait until the stream is not full."""
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

    # -- the front's side ----------------------------------------------------------------

    def cancel(self) -> None:
        """The client has gone: drop what is held and stop what is producing more."""
        if self.cancelled:
            return
        self.cancelled = True
        self._responses.clear()
        # Stopped before released: a Cancel ahead of the Resume spares one response.
        if self.on_cancel is not None and not self._ended:
            self.on_cancel()
        self._room()
        self._wake()

    def __aiter__(self) -> ResponseStream[T]:
        return self

    async def __anext__(self) -> T:
        while not self._responses:
            if self._ended or self.cancelled:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopAsyncIteration
            self._reader = asyncio.get_running_loop().create_future()
            await self._reader
        response, self.took_final = self._responses.popleft()
        self._room()
        return response

    def _room(self) -> None:
        if self._on_room and not self.full:
            callbacks, self._on_room = self._on_room, []
            for callback in callbacks:
                callback()

    def _wake(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)
