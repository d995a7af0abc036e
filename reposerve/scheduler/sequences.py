"""The sequence batcher of a stateful model (Triton's ``sequence_batching``).

A sequence is the requests that share a correlation id, from the one that starts it to
the one that ends it. Its requests run in the order they came, one at a time, on the one
instance the sequence was given when it started (a *lane*: that instance and a dynamic
batcher of its own), so a model that keeps state per sequence finds it where it left it.
Each lane holds a bounded number of sequences at once (the direct strategy's slots, the
oldest strategy's candidates); a sequence that finds every lane full waits for one to
end, as in Triton's backlog. A request that leaves the backlog (its caller cancelled it, or
its ``timeout`` passed) takes no slot, and a sequence none of whose requests ever ran is
let go as soon as none waits. Batches form from the ready requests of a lane's sequences,
at most one of each.

Before a request runs, the batcher adds what the model reads of its sequence: the
control inputs and its implicit state (``reposerve.scheduler.sequence_inputs``). A
sequence with no request for ``max_sequence_idle_microseconds`` is released with its
state; its later requests are refused until one starts it again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from reposerve.config import DynamicBatching, ModelConfig
from reposerve.datatypes import NUMPY_DTYPES
from reposerve.errors import (
    ErrorKind,
    InstanceError,
    ReposerveError,
    SchedulerError,
)
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.batcher import Scheduler
from reposerve.scheduler.clock import Clock, LoopClock, Timer
from reposerve.scheduler.lease import Lease, LeaseStream, take
from reposerve.scheduler.sequence_inputs import SequenceInputs
from reposerve.scheduler.work import Executor
from reposerve.statistics import FailureReason, ModelStatistics
from reposerve.tensor import Tensor

log = logging.getLogger("reposerve.scheduler")

SequenceId = int | str
_LOST_KEPT = 4096  # lost sequences remembered, to tell their next request why
_DECIMAL = re.compile(r"[1-9][0-9]*|0")  # an integer's own decimal form


class _Lane:
    """One instance, its own batcher, and how many sequences it holds now."""

    __slots__ = ("instance", "scheduler", "sequences")

    def __init__(self, instance: Executor, scheduler: Scheduler) -> None:
        self.instance = instance
        self.scheduler = scheduler
        self.sequences = 0


class _Sequence:
    __slots__ = ("key", "lane", "state", "turn", "waiting", "ran", "ended", "idle", "gone", "slot")

    def __init__(self, key: SequenceId | tuple[str, int]) -> None:
        self.key = key
        self.lane: _Lane | None = None
        self.slot: asyncio.Future | None = None  # its wait in the backlog, while there
        self.state: dict[str, Tensor] = {}  # implicit state, by the model's input name
        self.turn = asyncio.Lock()  # FIFO: the sequence's requests run in arrival order
        self.waiting = 0  # requests accepted and not finished
        self.ran = False  # a request of it reached its lane: the model has seen it
        self.ended = False  # its END request ran: the next must START it again
        self.idle: Timer | None = None
        self.gone: str | None = None  # why it was released under its requests


class SequenceBatcher:
    """Takes a sequence-batched model's requests as a ``Scheduler`` takes a model's."""

    def __init__(
        self,
        label: str,
        name: str,
        config: ModelConfig,
        statistics: ModelStatistics,
        folder: Path | None = None,
        clock: Clock | None = None,
    ) -> None:
        sequence = config.sequence_batching
        if sequence is None:
            raise ValueError(f"{label}: no sequence_batching in its config")
        self._label = label
        self._name = name
        self._config = config
        self._sequence = sequence
        self._statistics = statistics
        self._clock: Clock = clock or LoopClock()
        self._batched = config.max_batch_size > 0
        capacity = sequence.max_candidate_sequences if sequence.strategy == "oldest" else None
        self._capacity = capacity or max(config.max_batch_size, 1)
        self._lane_config = _lane_config(config)
        self._inputs = SequenceInputs(label, config, folder)
        self._lanes: list[_Lane] = []
        self._sequences: dict[SequenceId | tuple[str, int], _Sequence] = {}
        self._single = itertools.count()  # keys of single-request (iterative) sequences
        # Sequences waiting for a slot, oldest first, by their wait (dicts keep order): one
        # whose request leaves is taken out at once, so the backlog holds only live waits.
        self._backlog: dict[asyncio.Future, _Sequence] = {}
        # Why recently ended sequences went (their instance stopped, or they were idle too
        # long), for their next request: the refusal it gets, which says so.
        self._lost: OrderedDict[SequenceId | tuple[str, int], SchedulerError] = OrderedDict()
        self._running = 0  # requests accepted and not finished
        self._unsent = 0  # of those, not handed to a lane yet
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._aborted: ReposerveError | None = None
        self.revive: Callable[[], str | None] | None = None  # as Scheduler.revive
        self._expecting = False  # a revived instance is coming: requests wait for it
        # The datatype of its CORRID control, if it has one: what the model is told the id as.
        self._corrid = next(
            (c.datatype for c in sequence.control_input if c.kind == "corrid"), None
        )

    def load_initial_state(self) -> None:
        """Read each state's initial value (a file's, for some) before requests come."""
        self._inputs.load_initial_state()

    # -- what the version and the service use, as of a Scheduler -----------------------

    @property
    def pending(self) -> int:
        """Requests accepted and not running on an instance now."""
        return self._unsent + sum(lane.scheduler.pending for lane in self._lanes)

    @property
    def busy(self) -> bool:
        """Whether it holds requests, or sequences whose state is kept (an open one
        would lose it if its model went)."""
        return bool(self._running or self._sequences)

    @property
    def serving(self) -> bool:
        return bool(self._lanes)

    async def lease(self, request: InferRequest, call_depth: int = 0) -> Lease:
        return await take(self.submit(request, call_depth))

    def submit(self, request: InferRequest, call_depth: int = 0) -> asyncio.Future:
        sequence, request = self._admit(request)
        return self._start(sequence, request, call_depth, None)

    def stream(self, request: InferRequest, call_depth: int = 0) -> LeaseStream:
        """A decoupled model's request of a sequence: its responses pass through; the
        sequence's next request runs once the last has come."""
        sequence, request = self._admit(request)
        outer = LeaseStream()
        task = self._start(sequence, request, call_depth, outer)
        task.add_done_callback(_retrieve)  # its outcome went to the stream
        outer.on_cancel = task.cancel
        return outer

    def _start(
        self,
        sequence: _Sequence,
        request: InferRequest,
        call_depth: int,
        stream: LeaseStream | None,
    ) -> asyncio.Task:
        """The task running an admitted request, under its timeout while its sequence
        has no slot (``_deadline``). One cancelled before it ever ran (its caller left at
        once) is counted out here, since ``_run`` never saw it."""
        entered: list[bool] = []
        deadline = self._deadline(sequence, request)
        task = asyncio.ensure_future(self._run(sequence, request, call_depth, stream, entered))

        def ended(done: asyncio.Task) -> None:
            if deadline is not None:
                deadline.cancel()
            if not entered:
                self._unsent -= 1
                self._finished(sequence, request, ran=False)
                if stream is not None:
                    stream.end(None)

        task.add_done_callback(ended)
        return task

    async def drain(self) -> None:
        self._closed = True
        await self._idle.wait()
        await asyncio.gather(*(lane.scheduler.drain() for lane in self._lanes))

    def abort(self, error: ReposerveError) -> None:
        self._closed = True
        self._aborted = error
        self._fail_backlog(error)
        for lane in self._lanes:
            lane.scheduler.abort(error)

    def capacity_changed(self) -> None:
        for lane in self._lanes:
            lane.scheduler.capacity_changed()

    def add_instance(self, instance: Executor) -> None:
        scheduler = Scheduler(
            self._label, self._lane_config, [instance], self._statistics, self._clock
        )
        self._lanes.append(_Lane(instance, scheduler))
        self._expecting = False
        self._grant()

    def remove_instance(self, instance: Executor) -> None:
        """Its sequences are lost with it (a model's own state died with its process):
        what they have queued fails, and their later requests are refused until they
        start again."""
        lane = next((lane for lane in self._lanes if lane.instance is instance), None)
        if lane is None:
            return
        self._lanes.remove(lane)
        if self._closed and not self._lanes:  # none is coming back: the backlog fails now
            self._fail_backlog(
                self._aborted or SchedulerError(f"{self._label}: its last instance stopped")
            )
        why = f"{self._label}: the instance running this sequence stopped; start the sequence again"
        lane.scheduler.abort(SchedulerError(why))
        for sequence in [s for s in self._sequences.values() if s.lane is lane]:
            sequence.lane = None
            self._release(sequence, why)
            self._remember(sequence, SchedulerError(f"sequence {sequence.key} was lost: {why}"))

    def _remember(self, sequence: _Sequence, refusal: SchedulerError) -> None:
        """What the ended ``sequence``'s next request without START is told."""
        self._lost[sequence.key] = refusal
        while len(self._lost) > _LOST_KEPT:
            self._lost.popitem(last=False)

    # -- one request -------------------------------------------------------------------

    def _admit(self, request: InferRequest) -> tuple[_Sequence, InferRequest]:
        """The sequence ``request`` belongs to, or why it is refused (before it queues).
        An iterative model's request without an id is a sequence of its own (Triton's
        iterative sequences need no control)."""
        if self._closed:
            self._statistics.record_failure(1, 0, FailureReason.OTHER)
            raise self._aborted or SchedulerError(
                f"{self._label} is unloading; retry on another version"
            )
        if self.revive is not None and (why := self.revive()) is not None:
            self._expecting = True  # the requests after this one wait for the replacement
            self._statistics.record_failure(1, 0, FailureReason.OTHER)
            raise InstanceError(why)
        if not self._lanes and not self._expecting:
            self._statistics.record_failure(1, 0, FailureReason.OTHER)
            raise SchedulerError(
                f"{self._label} has no running instance (it is being restarted); retry shortly"
            )
        if self._batched and request.batch_size != 1:
            raise SchedulerError(  # Triton's words: one row per request of a sequence
                f"inference request to model '{self._name}' must specify batch-size 1 due to "
                f"requirements of sequence batcher (got {request.batch_size})",
                ErrorKind.INVALID_ARGUMENT,
            )
        key: SequenceId | tuple[str, int] = request.sequence_id
        if self._corrid is not None and key != 0 and key != "":
            # refused now, not in a slot
            key = _as_told(request.sequence_id, self._corrid, self._name)
            request = msgspec.structs.replace(request, sequence_id=key)
        if (key == 0 or key == "") and self._sequence.iterative_sequence:
            key = ("single request", next(self._single))
            request = msgspec.structs.replace(request, sequence_start=True, sequence_end=True)
        elif key == 0 or key == "":
            raise SchedulerError(
                f"inference request to model '{self._name}' must specify a non-zero or "
                "non-empty correlation ID",
                ErrorKind.INVALID_ARGUMENT,
            )
        sequence = self._sequences.get(key)
        lost = self._lost.pop(key, None)
        if sequence is None:
            if not request.sequence_start and lost is not None:
                raise lost
            if not request.sequence_start:
                raise SchedulerError(
                    f"inference request for sequence {key} to model '{self._name}' must "
                    "specify the START flag on the first request of the sequence",
                    ErrorKind.INVALID_ARGUMENT,
                )
            sequence = self._sequences[key] = _Sequence(key)
        if sequence.idle is not None:
            sequence.idle.cancel()
            sequence.idle = None
        sequence.waiting += 1
        self._running += 1
        self._unsent += 1
        self._idle.clear()
        return sequence, request

    async def _run(
        self,
        sequence: _Sequence,
        request: InferRequest,
        call_depth: int,
        stream: LeaseStream | None,
        entered: list[bool],
    ) -> Lease | None:
        entered.append(True)
        sent = False
        try:
            async with sequence.turn:
                if self._aborted is not None:
                    raise self._aborted
                if sequence.gone is not None:
                    raise SchedulerError(sequence.gone)
                if request.sequence_start:
                    sequence.ended = False
                    sequence.state = {}
                elif sequence.ended:
                    raise SchedulerError(
                        f"inference request for sequence {sequence.key} to model "
                        f"'{self._name}' must specify the START flag on the first request of "
                        "the sequence (its previous request ended it)",
                        ErrorKind.INVALID_ARGUMENT,
                    )
                lane = await self._slot(sequence)
                prepared = self._inputs.prepared(sequence.state, request)
                sent = sequence.ran = True
                self._unsent -= 1
                if stream is not None:
                    await self._pass_through(lane.scheduler.stream(prepared, call_depth), stream)
                    return None
                lease = await take(lane.scheduler.submit(prepared, call_depth))
                self._inputs.keep_state(sequence.state, lease)
                return lease
        except BaseException as exc:
            if stream is not None:
                stream.end(exc if isinstance(exc, Exception) else None)
            raise
        finally:
            if not sent:
                self._unsent -= 1
                if request.sequence_start and not sequence.ran:
                    self._start_withdrawn(sequence)
            self._finished(sequence, request)

    def _start_withdrawn(self, sequence: _Sequence) -> None:
        """A START left before it ran (its caller went, or it failed first): requests of
        the sequence behind it would reach the model without one, so they fail instead."""
        if sequence.waiting > 1 and sequence.gone is None:
            self._release(
                sequence,
                f"inference request for sequence {sequence.key} to model '{self._name}' must "
                "specify the START flag on the first request of the sequence (the request "
                "that started it left before it ran)",
            )

    async def _pass_through(self, inner: LeaseStream, outer: LeaseStream) -> None:
        try:
            async for lease in inner:
                outer.put(lease)
            outer.end(
                SchedulerError("the request was cancelled", ErrorKind.CANCELLED)
                if inner.cancelled
                else None
            )
        finally:
            inner.cancel()

    def _finished(self, sequence: _Sequence, request: InferRequest, ran: bool = True) -> None:
        """``ran``: the request took its turn (one cancelled before ends nothing)."""
        sequence.waiting -= 1
        self._running -= 1
        if request.sequence_end and ran:
            sequence.ended = True
            sequence.state = {}
        if sequence.waiting == 0 and sequence.gone is None:
            if sequence.ended or not sequence.ran:  # nothing of it for the model to go on with
                self._release(sequence, None)
            else:
                self._wait_idle(sequence)
        if self._running == 0:
            self._idle.set()

    def _wait_idle(self, sequence: _Sequence) -> None:
        idle_us = self._sequence.max_sequence_idle_microseconds
        if idle_us:
            sequence.idle = self._clock.call_later(idle_us * 1000, lambda: self._expire(sequence))

    def _expire(self, sequence: _Sequence) -> None:
        sequence.idle = None
        if sequence.waiting == 0 and self._sequences.get(sequence.key) is sequence:
            idle_us = self._sequence.max_sequence_idle_microseconds
            log.info(
                "%s: sequence %s released after %d us without a request",
                self._label,
                sequence.key,
                idle_us,
            )
            self._release(sequence, None)
            # Triton's words first (clients match them), then why: a client that paused
            # longer than the model allows learns which setting ended its sequence.
            refusal = SchedulerError(
                f"inference request for sequence {sequence.key} to model '{self._name}' must "
                "specify the START flag on the first request of the sequence (it was released "
                f"after {idle_us} us without a request: max_sequence_idle_microseconds)",
                ErrorKind.INVALID_ARGUMENT,
            )
            self._remember(sequence, refusal)

    def _release(self, sequence: _Sequence, why: str | None) -> None:
        """Free the sequence's slot for the next in the backlog; ``why``: it was lost
        while requests of it may still wait (they fail with it)."""
        if self._sequences.get(sequence.key) is sequence:
            del self._sequences[sequence.key]
        if sequence.idle is not None:
            sequence.idle.cancel()
            sequence.idle = None
        sequence.gone = why
        sequence.state = {}
        lane, sequence.lane = sequence.lane, None
        if lane is not None:
            lane.sequences -= 1
            self._grant()

    async def _slot(self, sequence: _Sequence) -> _Lane:
        """The sequence's lane; a new sequence gets the one holding fewest, or waits in
        the backlog until a sequence ends."""
        if sequence.lane is not None:
            return sequence.lane
        if self._closed and not self._lanes:
            raise self._aborted or SchedulerError(f"{self._label} is unloading; retry elsewhere")
        waiter = sequence.slot = asyncio.get_running_loop().create_future()
        self._backlog[waiter] = sequence
        self._grant()
        try:
            return await waiter
        finally:  # one that left (cancelled, timed out) leaves the backlog now
            self._backlog.pop(waiter, None)
            sequence.slot = None

    def _grant(self) -> None:
        """Give waiting sequences the free slots, oldest first."""
        while self._backlog:
            lane = min(self._lanes, key=lambda lane: lane.sequences, default=None)
            if lane is None or lane.sequences >= self._capacity:
                return
            waiter = next(iter(self._backlog))
            sequence = self._backlog.pop(waiter)
            if waiter.done():  # cancelled, its task not yet resumed to take it out
                continue
            sequence.lane = lane
            lane.sequences += 1
            waiter.set_result(lane)

    def _fail_backlog(self, error: ReposerveError) -> None:
        waiting, self._backlog = self._backlog, {}
        for waiter in waiting:
            if not waiter.done():
                waiter.set_exception(error)

    def _deadline(self, sequence: _Sequence, request: InferRequest) -> Timer | None:
        """The timer of ``request``'s ``timeout`` parameter, while its sequence has no slot.
        Triton's schedule-policy extension (docs/protocol/extension_schedule_policy.md,
        "Sequence Batcher with Direct Scheduling Strategy"): the timeout applies only to
        the requests of sequences not yet given a batch slot; when it passes, the request,
        its sequence and the sequence's requests received are terminated. Once a sequence
        has its slot, its requests' timeouts no longer count (``SequenceInputs.prepared``
        drops them).
        Triton names the direct strategy; both strategies share this one backlog here."""
        if not request.timeout_us or sequence.lane is not None:
            return None
        return self._clock.call_later(
            request.timeout_us * 1000, lambda: self._time_out(sequence, request.timeout_us)
        )

    def _time_out(self, sequence: _Sequence, timeout_us: int) -> None:
        if sequence.lane is not None or sequence.gone is not None:
            return  # it got its slot meanwhile, or it is gone already
        why = (
            f"{self._label}: timeout of sequence {sequence.key} expired: a request of it "
            f"waited {timeout_us} us (its timeout parameter) without a sequence slot, so the "
            "sequence and its requests were dropped; start it again"
        )
        log.info("%s", why)
        self._release(sequence, why)  # the requests behind it fail with ``why`` in turn
        waiter = sequence.slot
        if waiter is not None and not waiter.done():
            self._backlog.pop(waiter, None)
            waiter.set_exception(SchedulerError(why))


def _lane_config(config: ModelConfig) -> ModelConfig:
    """The config of one lane's batcher: the strategy's batching, and no re-run of a
    failed batch to isolate a fault (a model's state must not see a request twice)."""
    sequence = config.sequence_batching
    assert sequence is not None
    batching = None
    if config.max_batch_size > 0:
        batching = DynamicBatching(
            preferred_batch_size=sequence.preferred_batch_size,
            max_queue_delay_microseconds=sequence.max_queue_delay_microseconds,
        )
    execution = msgspec.structs.replace(config.execution, isolate_failures=False)
    return msgspec.structs.replace(config, dynamic_batching=batching, execution=execution)


def _as_told(key: SequenceId, datatype: str, model: str) -> SequenceId:
    """A correlation id in the form its model's CORRID control tells it, which is the
    sequence's key: one value the model sees is one sequence. For a BYTES control an
    integer id is its decimal string; for a numeric one a string id must be an integer
    written as that integer's own decimal (``"7"`` is 7; ``"07"``, ``"+7"``, ``" 7"``
    are refused, not made second sequences the model could not tell from 7)."""
    if datatype == "BYTES":
        return str(key)
    if isinstance(key, str):
        if _DECIMAL.fullmatch(key) is None:
            raise SchedulerError(
                f"model '{model}': correlation id '{key}' is a string; its CORRID control "
                f"is {datatype}, so the id must be an integer, as an int or a string of "
                "its decimal digits with no sign or leading zeros",
                ErrorKind.INVALID_ARGUMENT,
            )
        key = int(key)
    limits = np.iinfo(NUMPY_DTYPES[datatype])
    if not limits.min <= key <= limits.max:
        raise SchedulerError(
            f"model '{model}': correlation id {key} does not fit its CORRID control ({datatype})",
            ErrorKind.INVALID_ARGUMENT,
        )
    return key


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()
