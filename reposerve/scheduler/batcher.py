"""The scheduler of one model version: dispatch from its queue, timeouts, instance choice.

Requests wait in the queue (``reposerve.scheduler.queue``, one deque per priority level).
Whenever an instance is free (``reposerve.scheduler.instances`` picks which), the head of
the queue is offered to ``plan_batch``; a batch
is assembled straight into the chosen instance's shared memory, and what becomes of it
comes back as values the scheduler receives in one place (``_receive``): started, a
decoupled model's responses, its outcome. An outcome is cut into per-request shares
(``reposerve.scheduler.cutting``) that each caller gets as a lease on the slot
(``reposerve.scheduler.lease``), a decoupled model's as a stream of leases. Dispatch
runs on the next event-loop turn after a change, so requests arriving together leave
together.

Every accepted request ends in exactly one outcome, and a fault costs only the requests
it belongs to: when execute raises for a batch of several requests, the batch is run
again in halves (``split_for_isolation``) until the failing requests stand alone, and
only they fail; a version going away fails what it still holds with the reason.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import assert_never

from reposerve.backends.base import RequestFailure
from reposerve.config import ModelConfig
from reposerve.errors import InstanceError, InvalidInput, ReposerveError, SchedulerError
from reposerve.instance.outcomes import (
    BatchEvent,
    BatchFailure,
    BatchOutcome,
    BatchStarted,
    BatchTensor,
    FailureCause,
    PartUnreadable,
    SlotHold,
    StreamedResponse,
)
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.clock import Clock, LoopClock, Timer
from reposerve.scheduler.cutting import response_shares, shares
from reposerve.scheduler.instances import Instances
from reposerve.scheduler.lease import Lease, LeaseStream, take
from reposerve.scheduler.ordering import Delivery
from reposerve.scheduler.padding import PaddedBatch, Padding
from reposerve.scheduler.policy import BatchRules, Take, plan_batch, split_for_isolation
from reposerve.scheduler.queue import RequestQueue
from reposerve.scheduler.work import (
    Batch,
    Executor,
    Queued,
    batch_inputs,
    request_error,
    request_slice,
)
from reposerve.statistics import FailureReason, ModelStatistics


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
        self._padding = Padding.from_config(config)  # requests of different lengths batch
        self._instances = Instances(instances)
        self._statistics = statistics
        self._clock: Clock = clock or LoopClock()
        batching = config.dynamic_batching
        self._batched = config.max_batch_size > 0
        self._default_timeout_us = batching.default_timeout_microseconds if batching else 0
        self._delivery = Delivery(bool(batching and batching.preserve_ordering))
        self._isolate = config.execution.isolate_failures
        self._queue = RequestQueue(batching)
        # Run before the queue: parts of failed batches (rerun=True, to isolate a fault)
        # and batches handed back unstarted by an instance that died.
        self._reruns: deque[tuple[list[Queued], bool]] = deque()
        self._in_flight = 0
        self._staged = 0  # requests handed to an instance that has not started them
        self._dispatch_scheduled = False
        self._delay_timer: Timer | None = None
        self._closed = False
        self._aborted: ReposerveError | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        # Set by the owner when dead instances wait for a request to be replaced
        # (--instance-restart on-request): called on each arrival, it starts those
        # replacements and says why this request fails when no instance is live. Requests
        # after it wait for the replacement (``_expecting``) instead of being refused.
        self.revive: Callable[[], str | None] | None = None
        self._expecting = False

    @property
    def pending(self) -> int:
        """Requests accepted and not running on an instance now."""
        return len(self._queue) + self._staged + sum(len(items) for items, _ in self._reruns)

    @property
    def busy(self) -> bool:
        """Whether it holds requests: queued, staged or running."""
        return bool(self._queue.count or self._in_flight or self._reruns)

    @property
    def serving(self) -> bool:
        """Whether a live instance can take work (false while every one is restarting)."""
        return bool(self._instances)

    async def lease(self, request: InferRequest, call_depth: int = 0) -> Lease:
        """Queue ``request``, then a lease on its outputs (release it once they are read:
        its batch's slot waits for every lease), or its error. Nothing is queued until
        it is awaited, so a coroutine dropped unawaited leaves no lease behind.
        ``call_depth``: the model calls that made it (0: a client's)."""
        return await take(self.submit(request, call_depth))

    def submit(self, request: InferRequest, call_depth: int = 0) -> asyncio.Future:
        """Queue ``request`` now; the future resolves as ``lease`` does. Await it with
        ``take``, which releases a lease its caller left before it could read it."""
        return self._enqueue(request, None, call_depth).future

    def stream(self, request: InferRequest, call_depth: int = 0) -> LeaseStream:
        """Queue a decoupled model's ``request``: its responses come as leases (see
        ``LeaseStream`` for when the instance goes on to the next); the stream ends after
        the last, or with the request's error. Cancelling the stream cancels the request."""
        stream = LeaseStream()
        item = self._enqueue(request, stream, call_depth)
        stream.on_cancel = partial(self._abandon, item)
        item.future.add_done_callback(
            lambda done: stream.end(None if done.cancelled() else done.exception())
        )
        return stream

    def _enqueue(
        self, request: InferRequest, stream: LeaseStream | None, call_depth: int
    ) -> Queued:
        if self._closed:
            self._statistics.record_failure(1, 0, FailureReason.OTHER)
            raise SchedulerError(f"{self._label} is unloading; retry on another version")
        if self.revive is not None and (why := self.revive()) is not None:
            self._expecting = True
            self._statistics.record_failure(1, 0, FailureReason.OTHER)
            raise InstanceError(why)
        if not self._instances and not self._expecting:
            self._statistics.record_failure(1, 0, FailureReason.OTHER)
            raise SchedulerError(
                f"{self._label} has no running instance (it is being restarted); retry shortly"
            )
        if self._queue.full:
            self._statistics.record_failure(1, 0, FailureReason.REJECTED)
            raise SchedulerError(
                f"{self._label}: queue full ({self._queue.count} requests waiting, "
                "dynamic_batching.max_queue_size); retry later"
            )
        if self._padding is None:
            key = tuple((name, tensor.shape[1:]) for name, tensor in request.inputs.items())
        else:
            key = self._padding.key(request)
        future = asyncio.get_running_loop().create_future()
        item = Queued(request, future, key, self._clock.now(), stream, call_depth)
        future.add_done_callback(partial(self._tell_cancelled, item))
        timeout_us = request.timeout_us or self._default_timeout_us
        if timeout_us:
            item.timer = self._clock.call_later(timeout_us * 1000, partial(self._expire, item))
        self._queue.append(item)
        self._idle.clear()
        if self._queue.count == 1 and not self._in_flight:
            self._dispatch()  # an idle scheduler has nothing to gather: no need to wait a turn
        else:
            self._wake()
        return item

    async def drain(self) -> None:
        """Refuse new requests and wait until every accepted one has its outcome."""
        self._closed = True
        await self._idle.wait()

    def abort(self, error: ReposerveError) -> None:
        """Fail every request not running on an instance with ``error``, and refuse new
        ones. Batches running stay with their instances, which the owner stops."""
        self._closed = True
        self._aborted = error
        for item in self._queue.clear():
            self._fail(item, error, FailureReason.OTHER)
        while self._reruns:
            for item in self._reruns.popleft()[0]:
                self._fail(item, error, FailureReason.OTHER)
        self._check_idle()

    def capacity_changed(self) -> None:
        """An instance takes more batches now (one of its models waits on a call)."""
        self._wake()

    def add_instance(self, instance: Executor) -> None:
        self._instances.add(instance)
        self._expecting = False
        self._wake()

    def remove_instance(self, instance: Executor) -> None:
        """Stop using an instance (its process exited). Queued requests wait for the
        others, or for its replacement; the owner aborts if none is coming."""
        self._instances.remove(instance)
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
        while self._reruns:  # formed already, they cannot grow: staging them is fine
            instance = self._instances.free(staged=False) or self._instances.free(staged=True)
            if instance is None:
                return
            items, rerun = self._reruns.popleft()
            waiting = [item for item in items if not item.future.done()]
            for item in items:
                if item.future.cancelled():  # its client left while it waited
                    self._record_cancel(item)
                    self._settle(item, None, None)  # its turn, under preserve_ordering
            if waiting:
                self._launch(instance, waiting, rerun)
            else:
                self._check_idle()
        queue = self._queue
        while queue.count:
            instance = self._instances.free(staged=False)
            staged = instance is None
            if instance is None:  # staged
                # Cheap test first: this runs on every arrival while instances are busy.
                if queue.items < self._rules.full_size:
                    return
                instance = self._instances.free(staged=True)
                if instance is None:
                    return
            for item in queue.given_up():
                self._gone(item)
            head, blocked = queue.head(self._rules.max_batch_size, self._padding)
            if not head:  # what was queued had been given up by its callers
                self._check_idle()
                return
            sizes = [item.request.batch_size for item in head]
            if blocked:
                # A request of another shape follows: the batch cannot grow past it.
                sizes.append(self._rules.max_batch_size + 1)
            plan = plan_batch(sizes, self._clock.now() - head[0].enqueued_ns, self._rules)
            if not isinstance(plan, Take):
                self._delay_timer = self._clock.call_later(plan.ns, self._wake)
                return
            if staged and not plan.full:
                return  # a batch that can still grow waits for an instance to be free
            chosen = head[: plan.count]
            if staged and any(item.timer is not None for item in chosen):
                # A staged batch is in the instance's hands and runs whenever it comes
                # up; a request's timeout holds only while it is queued. So a batch with
                # a deadline in it waits here for a free instance, as every batch does in
                # Triton, whose queue policy rejects a request that times out before its
                # batch goes to an instance (model_config.proto, ModelQueuePolicy).
                return
            self._launch(instance, self._take(chosen), rerun=False)

    def _take(self, chosen: list[Queued]) -> list[Queued]:
        """Take ``chosen`` (queued, not done) out of the queue: the oldest, or (padding)
        requests of one key from wherever they are in it. Requests given up on between
        them go once they reach the front (``RequestQueue.given_up``)."""
        for item in chosen:
            self._queue.take(item)
            if item.timer is not None:
                item.timer.cancel()
            # Ordering is of the one answer of each request; streams end as they end.
            if self._delivery.ordered and item.stream is None:
                item.sequence = self._delivery.next_sequence()
        return chosen

    def _launch(self, instance: Executor, items: list[Queued], rerun: bool) -> None:
        requests = [item.request for item in items]
        self._in_flight += 1
        self._staged += len(items)
        batch = Batch(items, self._clock.now(), rerun)
        batch.instance = instance
        for item in items:
            item.batch = batch
        slices = [request_slice(request) for request in requests] if instance.per_request else ()
        # Only batches that calls made carry a depth (its models' calls go one deeper).
        depth = max(item.call_depth for item in items)
        deeper = {"call_depth": depth} if depth else {}
        try:
            batch.handle = instance.run(
                self._inputs(requests, rerun), partial(self._receive, batch), slices, **deeper
            )
        except PartUnreadable as exc:  # a client cut its shared memory short: its request
            self._in_flight -= 1  # fails alone, the rest go as a batch of their own
            self._staged -= len(items)
            for item in items:
                item.batch = None
            self._fail(items[exc.index], InvalidInput(exc.message), FailureReason.OTHER)
            rest = items[: exc.index] + items[exc.index + 1 :]
            if rest:
                self._launch(instance, rest, rerun)
            else:
                self._check_idle()
            return
        except (OSError, ValueError, MemoryError) as exc:  # ValueError, MemoryError: padding
            self._receive(
                batch,
                BatchFailure(
                    f"could not hand the batch to an instance: {exc}", FailureCause.INSTANCE
                ),
            )
        batch.launched_ns = self._clock.now()

    def _receive(self, batch: Batch, event: BatchEvent) -> None:
        """What its instance tells of ``batch``: every change to a running batch comes
        through here, in the order it happened."""
        match event:
            case BatchStarted():
                self._started(batch)
            case StreamedResponse():
                self._responded(batch, event)
            case BatchOutcome() | BatchFailure():
                self._complete(batch, event)
            case _:
                assert_never(event)

    def _inputs(self, requests: list[InferRequest], rerun: bool) -> list[BatchTensor]:
        if self._padding is None:
            return batch_inputs(requests, self._config.max_batch_size > 0)
        padded = PaddedBatch()
        count = sum(request.batch_size for request in requests)
        inputs = self._padding.inputs(requests, count, padded)
        if not rerun:  # a part of a failed batch was counted with it
            self._statistics.record_padding(padded.elements, padded.padding)
        return inputs

    def _started(self, batch: Batch) -> None:
        if batch.waiting:
            batch.waiting = False
            self._staged -= len(batch.items)

    def _responded(self, batch: Batch, response: StreamedResponse) -> None:
        """One response of a decoupled batch: each request's part (or the one request's,
        when it names one) goes to its stream as a lease. The instance goes on
        (``resume``) once every one of them is released."""
        batch.responded = True
        hold = SlotHold(partial(self._resumed, response.resume))  # its first share: ours
        try:  # the instance is resumed whatever cutting the response raises
            requests = [item.request for item in batch.items]
            parts = response_shares(requests, response, self._batched, self._padding)
            for index, outputs in parts:
                item = batch.items[index]
                stream = item.stream
                if stream is None or item.future.done():
                    continue
                if response.failure is not None:
                    self._fail(item, request_error(response.failure), FailureReason.BACKEND)
                    continue
                if outputs or not response.final:
                    stream.put(Lease(outputs, response.parameters, hold.share(), response.final))
                if response.final:  # its stream ends now, whatever the rest of the batch does
                    self._settle(item, None, None)
            self._stop_if_abandoned(batch)
        finally:
            hold.release()

    def _resumed(self, resume: Callable[[], None]) -> None:
        """A response's leases are all released: its instance goes on."""
        resume()
        if self._queue.count or self._reruns:  # a batch that ended meanwhile freed its slot
            self._wake()

    def _tell_cancelled(self, item: Queued, future: asyncio.Future) -> None:
        """A request whose caller cancelled it while it runs: its model may see that
        (``is_cancelled()``) and stop early; what it answers then goes nowhere."""
        batch = item.batch
        if future.cancelled() and batch is not None and batch.instance is not None:
            batch.instance.cancel_request(batch.handle, batch.items.index(item))

    def _abandon(self, item: Queued) -> None:
        """A streamed request's client has gone: a queued request is dropped when the
        queue reaches it; a running batch is stopped once none of its clients is left."""
        item.future.cancel()
        if item.batch is not None:
            self._stop_if_abandoned(item.batch)

    def _stop_if_abandoned(self, batch: Batch) -> None:
        """Cancel a running decoupled batch none of whose requests wants more."""
        if batch.instance is not None and all(item.future.done() for item in batch.items):
            batch.instance.cancel(batch.handle)

    def _complete(self, batch: Batch, outcome: BatchOutcome | BatchFailure) -> None:
        self._in_flight -= 1
        self._started(batch)
        if isinstance(outcome, BatchFailure):
            self._failed(batch, outcome)
        else:
            self._succeeded(batch, outcome)
        for item in batch.items:  # over: no cycle keeps the batch (and what it holds) alive
            if item.batch is batch:
                item.batch = None
        self._check_idle()
        if not (self._queue.count or self._reruns):
            return
        if isinstance(outcome, BatchFailure):
            self._wake()  # once its instance's fate (a restart, a removal) is known
        else:
            # At once, not after the answered requests' tasks have encoded and sent their
            # responses: the instance runs the next batch meanwhile.
            self._dispatch()

    def _succeeded(self, batch: Batch, outcome: BatchOutcome) -> None:
        now = self._clock.now()
        items = batch.items
        requests = [item.request for item in items]
        unserved = set()
        # The leases' share in the slot: the scheduler's until every lease is handed out.
        hold = SlotHold(partial(self._released, outcome.slot.share()))
        try:
            for index, share in enumerate(shares(requests, outcome, self._batched, self._padding)):
                item = items[index]
                if isinstance(share, RequestFailure):
                    # Failed by the model on its own (a Triton model's error response):
                    # the rest of the batch succeeded, so no isolation re-run is needed.
                    unserved.add(index)
                    self._fail(item, request_error(share), FailureReason.BACKEND)
                    continue
                if item.stream is not None:  # its responses have gone out as they came
                    future = item.future
                    if future.cancelled():  # its client left
                        self._record_cancel(item)
                        unserved.add(index)
                    elif not future.done():
                        self._settle(item, None, None)
                    elif future.exception() is not None:  # failed (and recorded) on its own
                        unserved.add(index)
                    continue
                self._settle(item, Lease(share.outputs, share.parameters, hold.share()), None)
        finally:
            hold.release()
        finished = self._clock.now()
        served = [item for index, item in enumerate(items) if index not in unserved]
        request_ns = [finished - item.enqueued_ns for item in served]
        queue_ns = [batch.started_ns - item.enqueued_ns for item in served]
        input_ns = batch.launched_ns - batch.started_ns
        self._statistics.record_batch(
            items=sum(request.batch_size for request in requests),
            requests=len(served),
            input_ns=input_ns,
            infer_ns=outcome.compute_ns,
            output_ns=finished - now,
            success_ns=sum(request_ns),
            queue_ns=sum(queue_ns),
        )
        self._statistics.record_latencies(
            request_ns, queue_ns, input_ns, outcome.compute_ns, finished - now
        )

    def _released(self, slot: SlotHold) -> None:
        """Every lease of a batch is released: its slot goes back to its instance, which
        may take a batch again."""
        slot.release()
        if self._queue.count or self._reruns:
            self._wake()

    def _failed(self, batch: Batch, failure: BatchFailure) -> None:
        if failure.cause is FailureCause.NOT_STARTED and self._aborted is None:
            self._reruns.appendleft((batch.items, batch.rerun))  # it was next in line
            return
        isolate = failure.raised and self._isolate and not batch.responded
        parts = split_for_isolation(len(batch.items)) if isolate else ()
        if parts and self._aborted is None:
            self._statistics.record_split(rerun=batch.rerun)
            start = 0
            for size in parts:
                self._reruns.append((batch.items[start : start + size], True))
                start += size
            return
        error: ReposerveError
        reason = FailureReason.BACKEND  # the model raised, or its process died running it
        if failure.cause is FailureCause.INVALID_INPUT:
            error = InvalidInput(failure.message)  # the model's own words, as in Triton
        elif failure.cause is FailureCause.STOPPED:  # the message names the version already
            error = SchedulerError(failure.message)
            reason = FailureReason.OTHER
        else:
            message = failure.message if failure.verbatim else f"{self._label}: {failure.message}"
            error = InstanceError(message)
            if failure.cause is FailureCause.NOT_STARTED:  # handed back while aborting
                reason = FailureReason.OTHER
        for item in batch.items:
            self._fail(item, error, reason, isolated=batch.rerun)

    # -- endings -----------------------------------------------------------------------

    def _expire(self, item: Queued) -> None:
        if not self._queue.take(item):
            return
        waited_us = (self._clock.now() - item.enqueued_ns) // 1000
        self._fail(
            item,
            SchedulerError(f"{self._label}: request timed out in the queue after {waited_us} us"),
            FailureReason.REJECTED,
        )
        self._check_idle()

    def _fail(
        self,
        item: Queued,
        error: ReposerveError,
        reason: FailureReason,
        isolated: bool = False,
    ) -> None:
        if item.timer is not None:
            item.timer.cancel()
        future = item.future
        if future.done() and not future.cancelled():  # its outcome was given (a stream)
            return
        if future.cancelled():  # its caller went first, whatever ended it here
            reason = FailureReason.CANCELED
        waited = self._clock.now() - item.enqueued_ns
        self._statistics.record_failure(1, waited, reason, isolated)
        self._settle(item, None, error)

    def _settle(self, item: Queued, lease: Lease | None, error: BaseException | None) -> None:
        """Hand ``item`` its outcome, in dispatch order under preserve_ordering."""
        self._delivery.settle(item.sequence, item.future, lease, error)

    def _gone(self, item: Queued) -> None:
        """A request whose caller gave up before it was scheduled, out of the queue."""
        if item.timer is not None:
            item.timer.cancel()
        self._record_cancel(item)

    def _record_cancel(self, item: Queued) -> None:
        # Only a cancelled caller completes a future still queued.
        waited = self._clock.now() - item.enqueued_ns
        self._statistics.record_failure(1, waited, FailureReason.CANCELED)

    def _check_idle(self) -> None:
        if not self._queue.count and not self._in_flight and not self._reruns:
            self._idle.set()
