"""The front's books on one instance process's batches: which run, which wait staged to
run next, which decoupled ones wait for their clients, and how many more it takes.

Pure logic, no asyncio and no socket: ``InstanceProcess`` tells the books what happened
(a batch sent or answered, a model call waited on or taken, a stream paused, resumed or
cancelled) and the loop time it happened at; the books tell each batch's owner what
begins then (``STARTED``) and, once the process is gone, fail what it held. Its
execution timeout reads the same books (``watchdog``).
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from reposerve.instance.outcomes import STARTED, BatchFailure, FailureCause, OnEvent, SlotHold

NESTED_LIMIT = 64  # batches an instance runs while its models wait on calls, at most


class Batch(msgspec.Struct):
    """A batch handed to the process: its slot, where its events go, and since when it
    runs (loop time; a staged batch starts when the one before it is answered). ``hold``
    gives the slot back once the batch has ended and no reader holds its outputs (those
    of its outcome, or a response not resumed yet)."""

    slot: int
    hold: SlotHold
    on_event: OnEvent
    since: float
    started: bool
    # A decoupled batch waiting for its clients to take a response: the execution
    # timeout does not run meanwhile (a slow reader is not a hung model).
    paused: bool = False
    cancelled: bool = False  # a decoupled batch told to stop


class Books:
    """The batches one process holds, by id (ids count up from 0, never reused)."""

    def __init__(self, max_inflight: int = 1, staging: int = 0) -> None:
        """Until the process says otherwise (its Ready), it runs one batch and stages none."""
        self.max_inflight = max_inflight  # batches the process runs at once (async: many)
        self.staging = staging  # batches it accepts beyond those, to start once one ends
        self._batches: dict[int, Batch] = {}
        self._next_id = 0
        # Model calls the process waits on: each is room for one more batch, which it runs
        # while it waits (a sync model calling itself must not wait for itself).
        self._nested_calls: set[int] = set()

    def __len__(self) -> int:
        return len(self._batches)

    def get(self, batch_id: int) -> Batch | None:
        return self._batches.get(batch_id)

    def items(self) -> Iterator[tuple[int, Batch]]:
        return iter(self._batches.items())

    def limit(self, staged: bool = False) -> int:
        """Batches the process may hold: those it runs at once, one more for each model call
        it waits on (a sync instance runs the next batch nested meanwhile, up to
        NESTED_LIMIT more), and (``staged``) those it accepts beyond them to run next."""
        running = self.max_inflight + min(len(self._nested_calls), NESTED_LIMIT)
        return running + self.staging if staged else running

    def add(
        self,
        slot: int,
        hold: SlotHold,
        on_event: OnEvent,
        now: float,
    ) -> int:
        """A batch sent at ``now``: it begins at once when the process runs fewer than it
        may, else it waits staged. Returns its id."""
        batch_id = self._next_id
        self._next_id += 1
        starts_now = len(self._batches) < self.limit()
        self._batches[batch_id] = Batch(slot, hold, on_event, now, starts_now)
        if starts_now:
            on_event(STARTED)
        return batch_id

    def answered(self, batch_id: int, now: float, next_starts: bool = True) -> Batch | None:
        """Take an answered batch off the books (None: it was failed already, as one that
        overran); a staged one behind it starts at ``now`` unless ``next_starts`` is
        False (the process ends, nothing more runs there)."""
        batch = self._batches.pop(batch_id, None)
        if batch is not None and next_starts:
            self._start_next(now)
        return batch

    def call_waits(self, call_id: int, now: float) -> None:
        """A batch's execute waits on model call ``call_id``: room for one more batch, and
        the oldest staged one begins now."""
        self._nested_calls.add(call_id)
        self._start_next(now)

    def call_taken(self, call_id: int) -> None:
        """The caller has its answer and runs on: the room it made is gone."""
        self._nested_calls.discard(call_id)

    def resume(self, batch_id: int, now: float) -> bool:
        """A paused decoupled batch may write its next response: its timeout runs again from
        ``now``. False when that batch is no longer on the books (it ended meanwhile)."""
        batch = self._batches.get(batch_id)
        if batch is None:
            return False
        batch.paused = False
        batch.since = now
        return True

    def cancel(self, batch_id: int, now: float) -> bool:
        """A decoupled batch's clients have gone: no Resume is coming, so it gets the
        execution timeout from ``now`` to stop. False when it is not held, or cancelled
        already."""
        batch = self._batches.get(batch_id)
        if batch is None or batch.cancelled:
            return False
        batch.cancelled = True
        batch.paused = False
        batch.since = now
        return True

    def fail_all(self, reason: str, cause: FailureCause) -> None:
        """The process is gone: every batch it held fails with ``reason``. Those still
        staged never ran: unless the owner is stopping everything (``STOPPED``), they fail
        as NOT_STARTED, to be run elsewhere."""
        failed, self._batches = self._batches, {}
        for batch in failed.values():
            if batch.started or cause is FailureCause.STOPPED:
                batch.on_event(BatchFailure(reason, cause))
            else:
                batch.on_event(BatchFailure(reason, FailureCause.NOT_STARTED))

    def _start_next(self, now: float) -> None:
        """The oldest batch sent but not begun begins now (the process runs frames in the
        order sent): one finished, or the one running waits on a model call."""
        for batch in self._batches.values():
            if not batch.started:
                batch.started = True
                batch.since = now
                batch.on_event(STARTED)
                return
