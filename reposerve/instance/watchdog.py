"""The execution timeout of one instance's batches (``execution.timeout_seconds``).

A hung execute cannot be interrupted inside the process, so a batch that outlives the
timeout gets the process killed (by ``InstanceProcess``, told through ``on_overran``).
One timer per instance, not one per batch: ``overdue`` is the rule, a pure function of
the books and the time; ``Watchdog`` keeps the timer on a clock (the event loop, or a
fake one in tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import msgspec

from reposerve.instance.books import Books


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Loop time in seconds, and callbacks later: what ``asyncio`` loops offer."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...


class Overran(msgspec.Struct, frozen=True):
    """This batch has run past the timeout."""

    batch_id: int


class Sleep(msgspec.Struct, frozen=True):
    """None has; the next could in ``seconds``."""

    seconds: float


def overdue(books: Books, now: float, limit: float) -> Overran | Sleep | None:
    """What the timeout says at ``now``. Rules:

    - the batch that has run longest (since it began, was resumed or cancelled) decides;
    - a decoupled batch paused for its clients has no deadline (a slow reader is not a
      hung model);
    - None: nothing runs, or every batch is paused (resuming one arms the watchdog again).
    """
    oldest_id = -1
    oldest_since = 0.0
    for batch_id, batch in books.items():
        if not batch.paused and (oldest_id < 0 or batch.since < oldest_since):
            oldest_id, oldest_since = batch_id, batch.since
    if oldest_id < 0:
        return None
    if now - oldest_since >= limit:
        return Overran(oldest_id)
    return Sleep(oldest_since + limit - now)


class Watchdog:
    """Keeps ``overdue`` on one timer: it wakes when the oldest batch it knew of would be
    due, reports whatever is overdue, and sleeps until the next one is."""

    def __init__(
        self, limit: float, books: Books, clock: Clock, on_overran: Callable[[int], None]
    ) -> None:
        """``limit``: the timeout in seconds (0: none)."""
        self.limit = limit
        self._books = books
        self._clock = clock
        self._on_overran = on_overran
        self._timer: Timer | None = None

    def arm(self) -> None:
        """A batch began to run, or runs again: make sure the timer is set."""
        if self._timer is None and self.limit:
            self._timer = self._clock.call_later(self.limit, self._watch)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _watch(self) -> None:
        self._timer = None
        verdict = overdue(self._books, self._clock.time(), self.limit)
        if isinstance(verdict, Overran):
            self._on_overran(verdict.batch_id)
        elif isinstance(verdict, Sleep):
            self._timer = self._clock.call_later(verdict.seconds, self._watch)
