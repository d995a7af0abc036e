"""Why requests fail, in Triton's ``reason`` labels, and the per request latencies the
summaries read: the scheduler with a fake clock and stand-in instances."""

from __future__ import annotations

import asyncio
import time

import pytest

from reposerve.errors import InstanceError, SchedulerError
from reposerve.instance.outcomes import FailureCause
from reposerve.scheduler.batcher import Scheduler
from reposerve.statistics import FailureReason, ModelStatistics
from tests.scheduler_fakes import (
    US,
    FakeClock,
    StandInInstance,
    lease_value,
    make_request,
    model_config,
)

pytestmark = pytest.mark.unit

REJECTED, CANCELED = FailureReason.REJECTED, FailureReason.CANCELED
BACKEND, OTHER = FailureReason.BACKEND, FailureReason.OTHER


def _scenario(batching: str | None, capacity: int = 1, summaries: bool = False):
    clock = FakeClock()
    instance = StandInInstance(capacity)
    statistics = ModelStatistics("m", 1, latency_summaries=summaries)
    scheduler = Scheduler(
        "model 'm' version 1", model_config(batching), [instance], statistics, clock
    )
    return scheduler, instance, clock, statistics


async def _turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def _counts(statistics: ModelStatistics) -> dict[FailureReason, int]:
    # Every failure has exactly one reason: the reasons add up to Triton's fail count.
    assert sum(statistics.failures.values()) == statistics.snapshot().inference_stats.fail.count
    return {reason: count for reason, count in statistics.failures.items() if count}


def test_a_full_queue_and_a_queue_timeout_are_rejected():
    async def body():
        scheduler, instance, clock, statistics = _scenario(
            "max_queue_size = 1\ndefault_timeout_microseconds = 500"
        )
        scheduler.submit(make_request([[0, 0]]))
        await _turn()  # runs; one may wait
        waiting = scheduler.submit(make_request([[1, 1]]))
        with pytest.raises(SchedulerError, match="queue full"):
            scheduler.submit(make_request([[2, 2]]))
        assert _counts(statistics) == {REJECTED: 1}
        clock.advance(600 * US)
        await _turn()
        with pytest.raises(SchedulerError, match="timed out in the queue"):
            waiting.result()
        assert _counts(statistics) == {REJECTED: 2}

    asyncio.run(body())


def test_a_model_error_and_a_dead_instance_are_backend_failures():
    async def body():
        scheduler, instance, _, statistics = _scenario(None)
        raised = scheduler.submit(make_request([[1, 1]]))
        await _turn()
        instance.fail("ValueError: no", FailureCause.MODEL)
        await _turn()
        died = scheduler.submit(make_request([[2, 2]]))
        await _turn()
        instance.fail("the instance process exited", FailureCause.INSTANCE)
        await _turn()
        for future in (raised, died):
            with pytest.raises(InstanceError):
                future.result()
        assert _counts(statistics) == {BACKEND: 2}

    asyncio.run(body())


def test_a_caller_gone_while_queued_is_canceled_and_unloading_is_other():
    async def body():
        scheduler, instance, _, statistics = _scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(make_request([[0, 0]]))
        await _turn()
        gone = scheduler.submit(make_request([[1, 1]]))
        gone.cancel()
        instance.finish()
        await _turn()
        assert _counts(statistics) == {CANCELED: 1}
        scheduler.submit(make_request([[2, 2]]))
        await _turn()  # runs, so the next two wait
        queued = scheduler.submit(make_request([[3, 3]]))
        dropped = scheduler.submit(make_request([[4, 4]]))
        queued.cancel()  # counted once, as canceled, although the abort finds it queued
        scheduler.abort(SchedulerError("model 'm' version 1 is unloading"))
        with pytest.raises(SchedulerError, match="unloading"):
            dropped.result()
        with pytest.raises(SchedulerError, match="unloading"):
            scheduler.submit(make_request([[5, 5]]))
        assert _counts(statistics) == {CANCELED: 2, OTHER: 2}

    asyncio.run(body())


def test_latencies_are_recorded_only_when_the_summaries_are_shown():
    async def body():
        scheduler, instance, _, statistics = _scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(make_request([[0, 0]]))
        await _turn()
        instance.finish()
        await _turn()
        assert statistics.snapshot().inference_count == 1
        assert statistics.latencies.request.count == 0

    asyncio.run(body())


def test_latencies_are_recorded_per_request_with_the_batch_compute_time():
    async def body():
        scheduler, instance, clock, statistics = _scenario(
            "max_queue_delay_microseconds = 0", summaries=True
        )
        scheduler.submit(make_request([[0, 0]]))
        await _turn()
        clock.advance(100 * US)
        later = [scheduler.submit(make_request([[i, i]])) for i in (1, 2)]
        clock.advance(300 * US)  # the two wait 300 us, the first has run 400 us
        instance.finish()
        await _turn()
        instance.finish()  # the two, batched
        await _turn()
        assert [lease_value(future).tolist() for future in later] == [[[1, 1]], [[2, 2]]]
        latencies = statistics.latencies
        assert latencies.request.count == latencies.queue.count == 3
        assert latencies.compute_infer.count == 3  # one batch of two counts twice
        assert latencies.request.total == pytest.approx(400 + 300 + 300)
        (median,) = latencies.request.quantiles([0.5], time.monotonic_ns())
        assert median == pytest.approx(300, rel=0.01)

    asyncio.run(body())
