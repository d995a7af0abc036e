"""The scheduler of one model version: queue, dynamic batcher, timeouts, instance choice.

Requests wait in one queue per priority level. Whenever an instance is free the head of
the queue is offered to ``plan_batch``; a batch is assembled straight into the chosen
instance's shared memory and comes back as one outcome, which is cut into per-request
views and handed to each request's ``finish`` while the slot is still held. Dispatch
runs on the next event-loop turn after a change, so requests arriving together leave
together.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

from reposerve.config import ModelConfig
from reposerve.errors import InstanceError, ReposerveError, SchedulerError
from reposerve.instance.process import BatchInput, BatchOutcome, OnDone
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.clock import Clock, LoopClock, Timer
from reposerve.scheduler.policy import BatchRules, Take, plan_batch
from reposerve.statistics import ModelStatistics
from reposerve.tensor import Tensor, split_batch

Finish = Callable[[dict[str, Tensor]], Any]
"""Turns a request's outputs (views valid only during the call) into its result."""


class Executor(Protocol):
    """What the scheduler needs of an instance."""

    @property
    def in_flight(self) -> int: ...

    def has_capacity(self) -> bool: ...

    def run(self, inputs: Sequence[BatchInput], on_done: OnDone) -> None: ...


class _Queued:
    __slots__ = ("request", "finish", "future", "key", "enqueued_ns", "timer")

    def __init__(
        self, request: InferRequest, finish: Finish, future: asyncio.Future, key: tuple, now: int
    ) -> None:
        self.request = request
        self.finish = finish
        self.future = future
        self.key = key
        self.enqueued_ns = now
        self.timer: Timer | None = None


class Scheduler:
    def __init__(
        self,
        label: str,
        config: ModelConfig,
        instances: Sequence[Executor],
        statistics: ModelStatistics,
        clock: Clock | None = None,
    ) -> None:
        self._label = label
        self._config = config
        self._rules = BatchRules.from_config(config)
        self._instances = list(instances)
        self._statistics = statistics
        self._clock: Clock = clock or LoopClock()
        batching = config.dynamic_batching
        self._levels = max(batching.priority_levels, 1) if batching else 1
        self._default_level = (batching.default_priority_level or self._levels) if batching else 1
        self._max_queue = batching.max_queue_size if batching else 0
        self._default_timeout_us = batching.default_timeout_microseconds if batching else 0
        self._ordered = bool(batching and batching.preserve_ordering)
        self._queues: list[deque[_Queued]] = [deque() for _ in range(self._levels)]
        self._queued = 0
        self._in_flight = 0
        self._dispatch_scheduled = False
        self._delay_timer: Timer | None = None
        self._rotation = 0
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        # preserve_ordering: batch sequence numbers, and finished batches held back
        self._launched = 0
        self._delivered = 0
        self._held: dict[int, list[tuple[asyncio.Future, Any, BaseException | None]]] = {}

    @property
    def pending(self) -> int:
        """Requests queued and not yet handed to an instance."""
        return self._queued

    def submit(self, request: InferRequest, finish: Finish) -> asyncio.Future:
        """Queue ``request``; the future resolves to ``finish``'s result or an error."""
        if self._closed:
            raise SchedulerError(f"{self._label} is unloading; retry on another version")
        if not self._instances:
            raise SchedulerError(f"{self._label} has no running instance; retry shortly")
        if self._max_queue and self._queued >= self._max_queue:
            raise SchedulerError(
                f"{self._label}: queue full ({self._queued} requests waiting, "
                "dynamic_batching.max_queue_size); retry later"
            )
        key = tuple((name, tensor.shape[1:]) for name, tensor in request.inputs.items())
        future = asyncio.get_running_loop().create_future()
        item = _Queued(request, finish, future, key, self._clock.now())
        timeout_us = request.timeout_us or self._default_timeout_us
        if timeout_us:
            item.timer = self._clock.call_later(timeout_us * 1000, partial(self._expire, item))
        level = (request.priority or self._default_level) - 1
        self._queues[level].append(item)
        self._queued += 1
        self._idle.clear()
        if self._queued == 1 and not self._in_flight:
            self._dispatch()  # an idle scheduler has nothing to gather: no need to wait a turn
        else:
            self._wake()
        return item.future

    async def drain(self) -> None:
        """Refuse new requests and wait until every queued and running one has finished."""
        self._closed = True
        await self._idle.wait()

    def add_instance(self, instance: Executor) -> None:
        self._instances.append(instance)
        self._wake()

    def remove_instance(self, instance: Executor) -> None:
        """Stop using an instance (its process exited); fail the queue if none is left."""
        if instance in self._instances:
            self._instances.remove(instance)
        if not self._instances:
            error = SchedulerError(f"{self._label}: every instance died; they are restarting")
            for queue in self._queues:
                while queue:
                    self._fail(queue.popleft(), error)
            self._queued = 0
            self._check_idle()
        else:
            self._wake()

    # -- dispatch ----------------------------------------------------------------------

    def _wake(self) -> None:
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        while self._queued:
            instance = self._free_instance()
            if instance is None:
                return
            head, blocked = self._head()
            if not head:
                return
            sizes = [item.request.batch_size for item in head]
            if blocked:
                # A request of another shape follows: the batch cannot grow past it.
                sizes.append(self._rules.max_batch_size + 1)
            plan = plan_batch(sizes, self._clock.now() - head[0].enqueued_ns, self._rules)
            if not isinstance(plan, Take):
                self._delay_timer = self._clock.call_later(plan.ns, self._wake)
                return
            self._launch(instance, self._pop(plan.count))

    def _free_instance(self) -> Executor | None:
        best: Executor | None = None
        count = len(self._instances)
        for step in range(count):
            instance = self._instances[(self._rotation + step) % count]
            if instance.has_capacity() and (best is None or instance.in_flight < best.in_flight):
                best = instance
        if best is not None:
            self._rotation = (self._rotation + 1) % count
        return best

    def _head(self) -> tuple[list[_Queued], bool]:
        """The oldest requests that may share a batch, and whether another shape follows."""
        for queue in self._queues:
            while queue and queue[0].future.done():
                self._discard(queue.popleft())
        head: list[_Queued] = []
        total = 0
        for item in itertools.chain.from_iterable(self._queues):
            if item.future.done():
                continue
            if head and item.key != head[0].key:
                return head, True
            head.append(item)
            total += item.request.batch_size
            if total > self._rules.max_batch_size:
                break
        return head, False

    def _pop(self, count: int) -> list[_Queued]:
        taken: list[_Queued] = []
        for queue in self._queues:
            while queue and len(taken) < count:
                item = queue.popleft()
                self._queued -= 1
                if item.timer is not None:
                    item.timer.cancel()
                if not item.future.done():
                    taken.append(item)
        return taken

    def _launch(self, instance: Executor, batch: list[_Queued]) -> None:
        first = batch[0].request
        items = sum(item.request.batch_size for item in batch)
        batched = self._config.max_batch_size > 0
        inputs = [
            (
                name,
                tensor.datatype,
                (items, *tensor.shape[1:]) if batched else tensor.shape,
                [item.request.inputs[name].raw for item in batch],
            )
            for name, tensor in first.inputs.items()
        ]
        sequence = self._launched
        self._launched += 1
        self._in_flight += 1
        # [started, handed over]: the hand-over time is known only after run() returns.
        times = [self._clock.now(), 0]

        def on_done(outcome: BatchOutcome | InstanceError) -> None:
            self._complete(batch, sequence, times[0], times[1] or times[0], outcome)

        try:
            instance.run(inputs, on_done)
        except OSError as exc:
            on_done(InstanceError(f"could not hand the batch to an instance: {exc}"))
        times[1] = self._clock.now()

    def _complete(
        self,
        batch: list[_Queued],
        sequence: int,
        started: int,
        launched: int,
        outcome: BatchOutcome | InstanceError,
    ) -> None:
        now = self._clock.now()
        deliveries: list[tuple[asyncio.Future, Any, BaseException | None]] = []
        if isinstance(outcome, InstanceError):
            error = InstanceError(f"{self._label}: {outcome.message}")
            deliveries = [(item.future, None, error) for item in batch]
            self._statistics.record_failure(
                len(batch), sum(now - item.enqueued_ns for item in batch)
            )
        else:
            sizes = [item.request.batch_size for item in batch]
            if self._config.max_batch_size > 0:
                pieces = {name: split_batch(t, sizes) for name, t in outcome.outputs.items()}
            else:  # no batch dimension: the batch is one request, its outputs whole
                pieces = {name: [tensor] for name, tensor in outcome.outputs.items()}
            for index, item in enumerate(batch):
                try:
                    result = item.finish({name: cut[index] for name, cut in pieces.items()})
                    deliveries.append((item.future, result, None))
                except ReposerveError as exc:
                    deliveries.append((item.future, None, exc))
            finished = self._clock.now()
            self._statistics.record_batch(
                items=sum(sizes),
                requests=len(batch),
                input_ns=launched - started,
                infer_ns=outcome.compute_ns,
                output_ns=finished - now,
                success_ns=sum(finished - item.enqueued_ns for item in batch),
                queue_ns=sum(started - item.enqueued_ns for item in batch),
            )
        self._in_flight -= 1
        if self._ordered:
            self._held[sequence] = deliveries
            while self._delivered in self._held:
                _deliver(self._held.pop(self._delivered))
                self._delivered += 1
        else:
            _deliver(deliveries)
        self._check_idle()
        if self._queued:
            self._wake()

    # -- endings -----------------------------------------------------------------------

    def _expire(self, item: _Queued) -> None:
        for queue in self._queues:
            try:
                queue.remove(item)
            except ValueError:
                continue
            self._queued -= 1
            waited_us = (self._clock.now() - item.enqueued_ns) // 1000
            self._fail(
                item,
                SchedulerError(
                    f"{self._label}: request timed out in the queue after {waited_us} us"
                ),
            )
            self._check_idle()
            return

    def _fail(self, item: _Queued, error: ReposerveError) -> None:
        if item.timer is not None:
            item.timer.cancel()
        if not item.future.done():
            item.future.set_exception(error)
        self._statistics.record_failure(1, self._clock.now() - item.enqueued_ns)

    def _discard(self, item: _Queued) -> None:
        """Drop a request whose caller gave up before it was scheduled."""
        self._queued -= 1
        if item.timer is not None:
            item.timer.cancel()

    def _check_idle(self) -> None:
        if not self._queued and not self._in_flight:
            self._idle.set()


def _deliver(deliveries: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    for future, result, error in deliveries:
        if future.done():
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
