"""Fault isolation in the scheduler: a failed batch of several requests is re-run in
halves until the failing requests stand alone; only they fail, everyone else gets their
own result. Stand-in instances judge each batch as a model would; no processes."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from reposerve.errors import InstanceError, InvalidInput, SchedulerError
from reposerve.instance.outcomes import (
    STARTED,
    BatchFailure,
    BatchOutcome,
    FailureCause,
    SlotHold,
)
from reposerve.scheduler.batcher import Scheduler
from reposerve.scheduler.policy import split_for_isolation
from reposerve.statistics import ModelStatistics
from reposerve.tensor import Tensor
from tests.scheduler_fakes import lease_value, make_request, model_config, run, scenario, turn

pytestmark = pytest.mark.unit


class JudgingInstance:
    """Fails any batch holding a negative value, as a model raising for bad input would;
    else answers Y = X. Finishes each batch on the next loop turn."""

    def __init__(self, cause: FailureCause = FailureCause.MODEL) -> None:
        self.cause = cause
        self.batches: list[list[float]] = []
        self.running = 0

    @property
    def in_flight(self) -> int:
        return self.running

    per_request = False

    def has_capacity(self, staged: bool = False) -> bool:
        return self.running == 0

    def run(self, inputs, on_event, requests=(), call_depth=0) -> int:
        (tensor,) = inputs
        batch = np.frombuffer(b"".join(tensor.parts), np.float32).reshape(tensor.shape)
        self.batches.append(batch[:, 0].tolist())
        self.running += 1
        on_event(STARTED)
        asyncio.get_running_loop().call_soon(self._finish, batch, on_event)
        return len(self.batches)

    def _finish(self, batch: np.ndarray, on_event) -> None:
        self.running -= 1
        if (batch < 0).any():
            on_event(BatchFailure("ValueError: negative input", self.cause))
        else:
            raw = memoryview(batch.tobytes())
            on_event(
                BatchOutcome({"Y": Tensor("FP32", batch.shape, raw)}, 0, SlotHold(lambda: None))
            )


async def _settle(futures) -> list:
    """Each future's result, or its exception."""
    await asyncio.wait(futures, timeout=10)
    return [f.exception() or lease_value(f).tolist() for f in futures]


def test_split_plan_halves_until_one():
    assert split_for_isolation(1) == ()
    assert split_for_isolation(2) == (1, 1)
    assert split_for_isolation(7) == (3, 4)


@pytest.mark.parametrize("bad", [0, 3, 7])
def test_one_bad_request_fails_alone_and_seven_get_their_results(bad):
    async def body():
        instance = JudgingInstance()
        scheduler, statistics = _scheduler(instance)
        values = [-1.0 if i == bad else float(i) for i in range(8)]
        futures = [scheduler.submit(make_request([[v, v]])) for v in values]
        outcomes = await _settle(futures)
        for i, outcome in enumerate(outcomes):
            if i == bad:
                assert isinstance(outcome, InstanceError)
                assert outcome.message == "model 'm' version 1: ValueError: negative input"
            else:
                assert outcome == [[float(i), float(i)]]
        assert instance.batches[0] == values  # one batch of eight failed first
        isolation = statistics.snapshot().isolation_stats
        # 8 -> 4+4 -> 2+2 -> 1+1: three splits, six re-runs, one request at fault
        assert (isolation.batches, isolation.executions, isolation.failed_requests) == (1, 6, 1)
        assert scheduler.pending == 0

    run(body)


def test_invalid_input_becomes_that_error_for_the_bad_request_only():
    async def body():
        scheduler, _ = _scheduler(JudgingInstance(FailureCause.INVALID_INPUT))
        futures = [scheduler.submit(make_request([[v, v]])) for v in (1, -2, 3, -4)]
        outcomes = await _settle(futures)
        assert outcomes[0] == [[1, 1]] and outcomes[2] == [[3, 3]]
        for outcome in (outcomes[1], outcomes[3]):
            assert isinstance(outcome, InvalidInput)
            # The model's own words, without the model/version prefix (Triton's rule).
            assert outcome.message == "ValueError: negative input"

    run(body)


def test_isolation_can_be_turned_off_for_models_with_side_effects():
    async def body():
        instance = JudgingInstance()
        scheduler, _ = _scheduler(instance, "[execution]\nisolate_failures = false")
        futures = [scheduler.submit(make_request([[v, v]])) for v in (1, -2, 3, 4)]
        outcomes = await _settle(futures)
        assert all(isinstance(outcome, InstanceError) for outcome in outcomes)
        assert len(instance.batches) == 1  # execute never ran twice

    run(body)


def test_a_dead_instance_is_not_retried_by_isolation():
    async def body():
        instance = JudgingInstance(FailureCause.INSTANCE)
        scheduler, _ = _scheduler(instance)
        futures = [scheduler.submit(make_request([[v, v]])) for v in (1, -2)]
        outcomes = await _settle(futures)
        assert all(isinstance(outcome, InstanceError) for outcome in outcomes)
        assert len(instance.batches) == 1

    run(body)


def test_isolation_keeps_the_order_under_preserve_ordering():
    async def body():
        scheduler, _ = _scheduler(JudgingInstance(), ordered=True)
        order: list[int] = []
        futures = []
        for i, v in enumerate((1, -2, 3, 4)):
            future = scheduler.submit(make_request([[v, v]]))
            future.add_done_callback(lambda _, i=i: order.append(i))
            futures.append(future)
        await _settle(futures)
        assert order == [0, 1, 2, 3]

    run(body)


def test_under_preserve_ordering_a_rerun_whose_caller_left_holds_back_no_later_request():
    async def body():
        batching = "max_queue_delay_microseconds = 0\npreserve_ordering = true"
        scheduler, (instance,), _ = scenario(batching)
        first = scheduler.submit(make_request([[1, 1]]))
        await turn()  # it runs alone; the next two queue behind it and batch together
        kept, left = (scheduler.submit(make_request([[v, v]])) for v in (2, 3))
        instance.finish()
        await turn()
        instance.fail("boom")  # the pair is rerun, one request at a time
        await turn()
        left.cancel()  # its caller leaves while its rerun waits for the first
        instance.finish()
        await turn()
        assert not instance.running  # nobody wants the second rerun
        later = scheduler.submit(make_request([[4, 4]]))
        await turn()
        instance.finish()
        await turn()
        assert lease_value(first).tolist() == [[1, 1]]
        assert lease_value(kept).tolist() == [[2, 2]]
        assert lease_value(later).tolist() == [[4, 4]]

    run(body)


def test_abort_answers_everything_queued_and_refuses_new():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        running = scheduler.submit(make_request([[1, 1]]))
        queued = [scheduler.submit(make_request([[v, v]])) for v in (2, 3)]
        assert scheduler.pending == 2
        scheduler.abort(SchedulerError("model 'm' version 1 was unloaded"))
        assert scheduler.pending == 0
        for future in queued:
            with pytest.raises(SchedulerError, match="was unloaded"):
                future.result()
        with pytest.raises(SchedulerError, match="is unloading"):
            scheduler.submit(make_request([[4, 4]]))
        instance.finish()  # the running batch keeps its instance until the owner stops it
        await turn()
        assert lease_value(running).tolist() == [[1, 1]]

    run(body)


def test_queued_requests_wait_for_a_replacement_when_every_instance_died():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(make_request([[1, 1]]))
        waiting = scheduler.submit(make_request([[2, 2]]))
        instance.fail("instance 0 was killed by SIGKILL", FailureCause.INSTANCE)
        scheduler.remove_instance(instance)
        await turn()
        assert not waiting.done() and not scheduler.serving
        with pytest.raises(SchedulerError, match="being restarted"):
            scheduler.submit(make_request([[3, 3]]))
        replacement = type(instance)()
        scheduler.add_instance(replacement)
        await turn()
        replacement.finish()
        await turn()
        assert lease_value(waiting).tolist() == [[2, 2]]

    run(body)


def _scheduler(instance, execution: str = "", ordered: bool = False):
    batching = (
        "max_queue_delay_microseconds = 20000\npreferred_batch_size = [8]\n"
        f"preserve_ordering = {'true' if ordered else 'false'}\n{execution}"
    )
    statistics = ModelStatistics("m", 1)
    scheduler = Scheduler("model 'm' version 1", model_config(batching), [instance], statistics)
    return scheduler, statistics


def test_drain_ends_when_the_last_queued_caller_gave_up():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(make_request([[1, 1]]))
        gone = scheduler.submit(make_request([[2, 2]]))
        drained = asyncio.ensure_future(scheduler.drain())
        gone.cancel()
        instance.finish()
        await turn()
        assert drained.done() and scheduler.pending == 0

    run(body)
