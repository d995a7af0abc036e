"""The scheduler with a fake clock and stand-in instances: every batching rule, timeouts,
queue limits, priorities and ordering, without processes or sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

import numpy as np
import pytest

from reposerve.config import parse_model_config
from reposerve.errors import InstanceError, SchedulerError
from reposerve.instance.outcomes import BatchFailure, BatchOutcome, FailureCause, SlotHold
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.batcher import Scheduler
from reposerve.statistics import ModelStatistics
from reposerve.tensor import Tensor

pytestmark = pytest.mark.unit

US = 1000


class FakeTimer:
    def __init__(self, due: int, callback: Callable[[], None]) -> None:
        self.due = due
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    def __init__(self) -> None:
        self.ns = 0
        self.timers: list[FakeTimer] = []

    def now(self) -> int:
        return self.ns

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.ns + delay_ns, callback)
        self.timers.append(timer)
        return timer

    def advance(self, ns: int) -> None:
        self.ns += ns
        due = sorted((t for t in self.timers if t.due <= self.ns), key=lambda t: t.due)
        self.timers = [t for t in self.timers if t.due > self.ns]
        for timer in due:
            if not timer.cancelled:
                timer.callback()


class StandInInstance:
    """Records the batches it is given; the test finishes them (Y = X) when it likes."""

    def __init__(self, capacity: int = 1, staging: int = 0) -> None:
        self.capacity = capacity
        self.staging = staging
        self.running: list[tuple[np.ndarray, Callable, Callable | None]] = []
        self.batches: list[np.ndarray] = []
        self.freed: list[int] = []  # the slots given back, by the order their batches ended

    @property
    def in_flight(self) -> int:
        return len(self.running)

    per_request = False

    def has_capacity(self, staged: bool = False) -> bool:
        return len(self.running) < self.capacity + (self.staging if staged else 0)

    def run(self, inputs, on_done, on_start=None, requests=(), on_response=None) -> int:
        (tensor,) = inputs
        batch = np.frombuffer(b"".join(tensor.parts), np.float32).reshape(tensor.shape)
        self.running.append((batch, on_done, on_start))
        self.batches.append(batch)
        if len(self.running) <= self.capacity and on_start:  # else staged: starts later
            on_start()
        return len(self.batches)

    def finish(self, index: int = 0) -> None:
        batch, on_done, _ = self._take(index)
        slot = SlotHold(partial(self.freed.append, len(self.freed)))
        try:
            on_done(
                BatchOutcome(
                    {"Y": Tensor("FP32", batch.shape, memoryview(batch.tobytes()))}, 0, slot
                )
            )
        finally:
            slot.release()  # as an instance does once on_done returns

    def fail(self, message: str, cause: FailureCause = FailureCause.MODEL) -> None:
        _, on_done, _ = self._take(0)
        on_done(BatchFailure(message, cause))

    def _take(self, index: int) -> tuple[np.ndarray, Callable, Callable | None]:
        taken = self.running.pop(index)
        if len(self.running) >= self.capacity and (on_start := self.running[self.capacity - 1][2]):
            on_start()  # the first staged batch moves up
        return taken


def _config(batching: str | None, max_batch: int = 8, dims: str = "[2]"):
    text = f"""
        max_batch_size = {max_batch}
        [[input]]
        name = "X"
        datatype = "FP32"
        shape = {dims}
        [[output]]
        name = "Y"
        datatype = "FP32"
        shape = {dims}
    """
    if batching is not None:
        text += f"[dynamic_batching]\n{batching}\n"
    return parse_model_config(text, "m/config.toml")


def _request(values, priority: int = 0, timeout_us: int = 0) -> InferRequest:
    array = np.asarray(values, np.float32)
    return InferRequest(
        id=None,
        inputs={"X": Tensor("FP32", array.shape, memoryview(array.tobytes()))},
        batch_size=array.shape[0],
        outputs=None,
        binary_output=False,
        priority=priority,
        timeout_us=timeout_us,
    )


def _result(future: asyncio.Future) -> np.ndarray:
    """The request's Y, copied out of its lease, which is released."""
    with future.result() as lease:
        y = lease.outputs["Y"]
        return np.frombuffer(y.raw, np.float32).reshape(y.shape).copy()


async def _turn() -> None:
    """Let call_soon callbacks (the dispatcher) run."""
    for _ in range(3):
        await asyncio.sleep(0)


def scenario(
    batching: str | None, instances: int = 1, capacity: int = 1, staging: int = 0, **config
):
    clock = FakeClock()
    stand_ins = [StandInInstance(capacity, staging) for _ in range(instances)]
    scheduler = Scheduler(
        "model 'm' version 1",
        _config(batching, **config),
        stand_ins,
        ModelStatistics("m", 1),
        clock,
    )
    return scheduler, stand_ins, clock


def run(test: Callable) -> None:
    asyncio.run(test())


def test_without_dynamic_batching_requests_run_alone_and_spread():
    async def body():
        scheduler, (a, b), _ = scenario(None, instances=2)
        futures = [scheduler.submit(_request([[i, i]])) for i in range(2)]
        await _turn()
        assert [len(x.batches) for x in (a, b)] == [1, 1]
        a.finish()
        b.finish()
        await _turn()
        assert [_result(f).tolist() for f in futures] == [[[0, 0]], [[1, 1]]]

    run(body)


def test_an_idle_scheduler_dispatches_at_once_and_a_busy_one_gathers():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(_request([[0, 0]]))
        assert len(instance.batches) == 1  # no loop turn needed
        scheduler.submit(_request([[1, 1]]))
        scheduler.submit(_request([[2, 2]]))
        instance.finish()
        await _turn()
        assert instance.batches[1].tolist() == [[1, 1], [2, 2]]

    run(body)


def test_queue_delay_collects_a_batch():
    async def body():
        scheduler, (instance,), clock = scenario("max_queue_delay_microseconds = 1000")
        futures = [scheduler.submit(_request([[i, -i]])) for i in range(3)]
        await _turn()
        assert instance.batches == []
        clock.advance(999 * US)
        await _turn()
        assert instance.batches == []
        clock.advance(1 * US)
        await _turn()
        assert instance.batches[0].shape == (3, 2)
        instance.finish()
        await _turn()
        for i, future in enumerate(futures):
            assert _result(future).tolist() == [[i, -i]]  # each gets its own slice back

    run(body)


def test_preferred_size_leaves_at_once_and_the_rest_waits():
    async def body():
        scheduler, (instance,), clock = scenario(
            "preferred_batch_size = [2]\nmax_queue_delay_microseconds = 10000", capacity=2
        )
        for i in range(3):
            scheduler.submit(_request([[i, i]]))
        await _turn()
        assert [b.shape[0] for b in instance.batches] == [2]
        clock.advance(10_000 * US)
        await _turn()
        assert [b.shape[0] for b in instance.batches] == [2, 1]

    run(body)


def test_requests_queue_while_busy_and_leave_together():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(_request([[0, 0]]))
        await _turn()
        later = [scheduler.submit(_request([[i, i]])) for i in range(1, 5)]
        await _turn()
        assert len(instance.batches) == 1
        instance.finish()
        await _turn()
        assert instance.batches[1].tolist() == [[1, 1], [2, 2], [3, 3], [4, 4]]
        instance.finish()
        await _turn()
        assert [_result(f).tolist() for f in later] == [[[i, i]] for i in range(1, 5)]

    run(body)


def test_multi_item_requests_are_packed_whole():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0", max_batch=4)
        scheduler.submit(_request(np.zeros((3, 2))))
        scheduler.submit(_request(np.ones((2, 2))))
        await _turn()
        instance.finish()
        await _turn()
        assert [b.shape[0] for b in instance.batches] == [3, 2]

    run(body)


def test_only_matching_shapes_share_a_batch():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0", dims="[-1]")
        scheduler.submit(_request([[0, 0]]))  # occupies the instance
        for values in ([[1, 2]], [[3, 4]], [[5, 6, 7]]):
            scheduler.submit(_request(values))
        await _turn()
        instance.finish()
        await _turn()
        instance.finish()
        await _turn()
        assert [b.shape for b in instance.batches] == [(1, 2), (2, 2), (1, 3)]

    run(body)


def test_queue_full_is_refused_with_a_clear_error():
    async def body():
        scheduler, _, _ = scenario("max_queue_size = 2")
        scheduler.submit(_request([[0, 0]]))
        await _turn()  # the first one runs; two may wait
        scheduler.submit(_request([[1, 1]]))
        scheduler.submit(_request([[2, 2]]))
        with pytest.raises(SchedulerError, match=r"queue full \(2 requests waiting"):
            scheduler.submit(_request([[3, 3]]))

    run(body)


def test_expired_requests_fail_and_never_run():
    async def body():
        scheduler, (instance,), clock = scenario("default_timeout_microseconds = 500")
        scheduler.submit(_request([[0, 0]]))
        await _turn()
        waiting = scheduler.submit(_request([[1, 1]]))
        patient = scheduler.submit(_request([[2, 2]], timeout_us=5000))
        clock.advance(600 * US)
        await _turn()
        with pytest.raises(SchedulerError, match="timed out in the queue after 600 us"):
            waiting.result()
        instance.finish()
        await _turn()
        assert instance.batches[1].tolist() == [[2, 2]]
        instance.finish()
        await _turn()
        assert _result(patient).tolist() == [[2, 2]]

    run(body)


def test_higher_priority_leaves_first():
    async def body():
        scheduler, (instance,), _ = scenario(
            "priority_levels = 2\ndefault_priority_level = 2", max_batch=1
        )
        scheduler.submit(_request([[0, 0]]))
        await _turn()
        scheduler.submit(_request([[1, 1]]))  # default level 2
        scheduler.submit(_request([[2, 2]], priority=1))
        instance.finish()
        await _turn()
        instance.finish()
        await _turn()
        assert [b.tolist() for b in instance.batches[1:]] == [[[2, 2]], [[1, 1]]]

    run(body)


@pytest.mark.parametrize("ordered", [True, False])
def test_preserve_ordering_holds_later_batches(ordered):
    async def body():
        scheduler, (a, b), _ = scenario(
            f"preserve_ordering = {str(ordered).lower()}", instances=2, max_batch=1
        )
        first = scheduler.submit(_request([[1, 1]]))
        second = scheduler.submit(_request([[2, 2]]))
        await _turn()
        b.finish()
        await _turn()
        assert second.done() is not ordered
        a.finish()
        await _turn()
        assert first.done() and second.done()

    run(body)


def test_cancelled_requests_do_not_run():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(_request([[0, 0]]))
        await _turn()
        gone = scheduler.submit(_request([[1, 1]]))
        kept = scheduler.submit(_request([[2, 2]]))
        gone.cancel()
        instance.finish()
        await _turn()
        assert instance.batches[1].tolist() == [[2, 2]]
        instance.finish()
        await _turn()
        assert _result(kept).tolist() == [[2, 2]]

    run(body)


def test_a_failed_batch_fails_exactly_its_requests():
    async def body():
        scheduler, (a, b), _ = scenario(None, instances=2)
        doomed = scheduler.submit(_request([[1, 1]]))
        fine = scheduler.submit(_request([[2, 2]]))
        await _turn()
        a.fail("ValueError: boom")
        b.finish()
        await _turn()
        with pytest.raises(InstanceError, match="model 'm' version 1: ValueError: boom"):
            doomed.result()
        assert _result(fine).tolist() == [[2, 2]]

    run(body)


def test_drain_waits_for_running_work_and_refuses_new():
    async def body():
        scheduler, (instance,), _ = scenario(None)
        running = scheduler.submit(_request([[1, 1]]))
        await _turn()
        drained = asyncio.ensure_future(scheduler.drain())
        await _turn()
        assert not drained.done()
        with pytest.raises(SchedulerError, match="is unloading"):
            scheduler.submit(_request([[2, 2]]))
        instance.finish()
        await _turn()
        assert drained.done() and _result(running).tolist() == [[1, 1]]

    run(body)


def test_a_busy_instance_takes_a_full_batch_to_run_next_but_not_one_that_can_grow():
    async def body():
        scheduler, (instance,), _ = scenario(
            "max_queue_delay_microseconds = 0", max_batch=2, staging=1
        )
        futures = [scheduler.submit(_request([[0, 0]]))]
        futures.append(scheduler.submit(_request([[1, 1]])))
        await _turn()
        assert len(instance.batches) == 1  # [1, 1] could still grow: it waits
        futures.append(scheduler.submit(_request([[2, 2]])))
        await _turn()
        assert instance.batches[1].tolist() == [[1, 1], [2, 2]]  # full: staged
        assert scheduler.pending == 2  # staged, not running: still awaiting execution
        futures += [scheduler.submit(_request([[i, i]])) for i in (3, 4)]
        await _turn()
        assert len(instance.batches) == 2  # one running, one staged: no room
        instance.finish()
        await _turn()
        assert instance.batches[2].tolist() == [[3, 3], [4, 4]]
        instance.finish()
        instance.finish()
        await _turn()
        assert [_result(f).tolist() for f in futures] == [[[i, i]] for i in range(5)]

    run(body)


def test_a_batch_handed_back_unstarted_runs_next_and_fails_nobody():
    async def body():
        scheduler, (instance,), _ = scenario(None, staging=1)
        crashed, staged, queued = (scheduler.submit(_request([[i, i]])) for i in range(3))
        await _turn()
        assert len(instance.batches) == 2
        # The process died running the first batch; the staged one never began.
        instance.fail("instance 0 was killed by SIGKILL", FailureCause.INSTANCE)
        instance.fail("instance 0 was killed by SIGKILL", FailureCause.NOT_STARTED)
        await _turn()
        assert [b.tolist() for b in instance.batches[2:]] == [[[1, 1]], [[2, 2]]]
        instance.finish()
        instance.finish()
        await _turn()
        with pytest.raises(InstanceError, match="SIGKILL"):
            crashed.result()
        assert _result(staged).tolist() == [[1, 1]] and _result(queued).tolist() == [[2, 2]]
        assert scheduler.pending == 0

    run(body)
