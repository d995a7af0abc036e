"""Handing requests their outcomes: at once, or (``preserve_ordering``) in the order they
were dispatched, a finished request held back until those sent before it have theirs."""

from __future__ import annotations

import asyncio
from typing import Any


class Delivery:
    def __init__(self, ordered: bool) -> None:
        self.ordered = ordered
        self._dispatched = 0
        self._delivered = 0
        self._held: dict[int, tuple[asyncio.Future, Any, BaseException | None]] = {}

    def next_sequence(self) -> int:
        """The dispatch number of the next request sent to an instance."""
        sequence = self._dispatched
        self._dispatched += 1
        return sequence

    def settle(
        self, sequence: int, future: asyncio.Future, result: Any, error: BaseException | None
    ) -> None:
        """Hand ``future`` its outcome; ``sequence`` < 0: unordered (or never dispatched)."""
        if sequence < 0:
            deliver(future, result, error)
            return
        self._held[sequence] = (future, result, error)
        while self._delivered in self._held:
            deliver(*self._held.pop(self._delivered))
            self._delivered += 1


def deliver(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """``future``'s result or error, unless it has one already (its caller left)."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
