"""Handing requests their outcomes: at once, or (``preserve_ordering``) in the order they
were dispatched, a finished request held back until those sent before it have theirs."""

from __future__ import annotations

import asyncio

from reposerve.scheduler.lease import Lease, deliver


class Delivery:
    def __init__(self, ordered: bool) -> None:
        self.ordered = ordered
        self._dispatched = 0
        self._delivered = 0
        self._held: dict[int, tuple[asyncio.Future, Lease | None, BaseException | None]] = {}

    def next_sequence(self) -> int:
        """The dispatch number of the next request sent to an instance."""
        sequence = self._dispatched
        self._dispatched += 1
        return sequence

    def settle(
        self,
        sequence: int,
        future: asyncio.Future,
        lease: Lease | None,
        error: BaseException | None,
    ) -> None:
        """Hand ``future`` its outcome; ``sequence`` < 0: unordered (or never dispatched).
        A lease held back is copied out of its slot first: the slot is not held hostage
        to another batch (held back, it was encoded, a copy too, before leases)."""
        if sequence < 0:
            deliver(future, lease, error)
            return
        if sequence != self._delivered and lease is not None:
            lease = lease.detach()
        self._held[sequence] = (future, lease, error)
        while self._delivered in self._held:
            deliver(*self._held.pop(self._delivered))
            self._delivered += 1
