"""The scheduler with a fake clock and stand-in instances: every batching rule, timeouts,
queue limits, priorities and ordering, without processes or sleeping."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from reposerve.errors import InstanceError, SchedulerError
from reposerve.instance.outcomes import FailureCause
from tests.scheduler_fakes import (
    US,
    lease_value,
    make_request,
    run,
    scenario,
    turn,
)

pytestmark = pytest.mark.unit


def test_without_dynamic_batching_requests_run_alone_and_spread():
    async def body():
        scheduler, (a, b), _ = scenario(None, instances=2)
        futures = [scheduler.submit(make_request([[i, i]])) for i in range(2)]
        await turn()
        assert [len(x.batches) for x in (a, b)] == [1, 1]
        a.finish()
        b.finish()
        await turn()
        assert [lease_value(f).tolist() for f in futures] == [[[0, 0]], [[1, 1]]]

    run(body)


def test_an_idle_scheduler_dispatches_at_once_and_a_busy_one_gathers():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(make_request([[0, 0]]))
        assert len(instance.batches) == 1  # no loop turn needed
        scheduler.submit(make_request([[1, 1]]))
        scheduler.submit(make_request([[2, 2]]))
        instance.finish()
        await turn()
        assert instance.batches[1].tolist() == [[1, 1], [2, 2]]

    run(body)


def test_queue_delay_collects_a_batch():
    async def body():
        scheduler, (instance,), clock = scenario("max_queue_delay_microseconds = 1000")
        futures = [scheduler.submit(make_request([[i, -i]])) for i in range(3)]
        await turn()
        assert instance.batches == []
        clock.advance(999 * US)
        await turn()
        assert instance.batches == []
        clock.advance(1 * US)
        await turn()
        assert instance.batches[0].shape == (3, 2)
        instance.finish()
        await turn()
        for i, future in enumerate(futures):
            assert lease_value(future).tolist() == [[i, -i]]  # each gets its own slice back

    run(body)


def test_preferred_size_leaves_at_once_and_the_rest_waits():
    async def body():
        scheduler, (instance,), clock = scenario(
            "preferred_batch_size = [2]\nmax_queue_delay_microseconds = 10000", capacity=2
        )
        for i in range(3):
            scheduler.submit(make_request([[i, i]]))
        await turn()
        assert [b.shape[0] for b in instance.batches] == [2]
        clock.advance(10_000 * US)
        await turn()
        assert [b.shape[0] for b in instance.batches] == [2, 1]

    run(body)


def test_requests_queue_while_busy_and_leave_together():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(make_request([[0, 0]]))
        await turn()
        later = [scheduler.submit(make_request([[i, i]])) for i in range(1, 5)]
        await turn()
        assert len(instance.batches) == 1
        instance.finish()
        await turn()
        assert instance.batches[1].tolist() == [[1, 1], [2, 2], [3, 3], [4, 4]]
        instance.finish()
        await turn()
        assert [lease_value(f).tolist() for f in later] == [[[i, i]] for i in range(1, 5)]

    run(body)


def test_multi_item_requests_are_packed_whole():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0", max_batch=4)
        scheduler.submit(make_request(np.zeros((3, 2))))
        scheduler.submit(make_request(np.ones((2, 2))))
        await turn()
        instance.finish()
        await turn()
        assert [b.shape[0] for b in instance.batches] == [3, 2]

    run(body)


def test_only_matching_shapes_share_a_batch():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0", dims="[-1]")
        scheduler.submit(make_request([[0, 0]]))  # occupies the instance
        for values in ([[1, 2]], [[3, 4]], [[5, 6, 7]]):
            scheduler.submit(make_request(values))
        await turn()
        instance.finish()
        await turn()
        instance.finish()
        await turn()
        assert [b.shape for b in instance.batches] == [(1, 2), (2, 2), (1, 3)]

    run(body)


def test_queue_full_is_refused_with_a_clear_error():
    async def body():
        scheduler, _, _ = scenario("max_queue_size = 2")
        scheduler.submit(make_request([[0, 0]]))
        await turn()  # the first one runs; two may wait
        scheduler.submit(make_request([[1, 1]]))
        scheduler.submit(make_request([[2, 2]]))
        with pytest.raises(SchedulerError, match=r"queue full \(2 requests waiting"):
            scheduler.submit(make_request([[3, 3]]))

    run(body)


def test_expired_requests_fail_and_never_run():
    async def body():
        scheduler, (instance,), clock = scenario("default_timeout_microseconds = 500")
        scheduler.submit(make_request([[0, 0]]))
        await turn()
        waiting = scheduler.submit(make_request([[1, 1]]))
        patient = scheduler.submit(make_request([[2, 2]], timeout_us=5000))
        clock.advance(600 * US)
        await turn()
        with pytest.raises(SchedulerError, match="timed out in the queue after 600 us"):
            waiting.result()
        instance.finish()
        await turn()
        assert instance.batches[1].tolist() == [[2, 2]]
        instance.finish()
        await turn()
        assert lease_value(patient).tolist() == [[2, 2]]

    run(body)


def test_higher_priority_leaves_first():
    async def body():
        scheduler, (instance,), _ = scenario(
            "priority_levels = 2\ndefault_priority_level = 2", max_batch=1
        )
        scheduler.submit(make_request([[0, 0]]))
        await turn()
        scheduler.submit(make_request([[1, 1]]))  # default level 2
        scheduler.submit(make_request([[2, 2]], priority=1))
        instance.finish()
        await turn()
        instance.finish()
        await turn()
        assert [b.tolist() for b in instance.batches[1:]] == [[[2, 2]], [[1, 1]]]

    run(body)


@pytest.mark.parametrize("ordered", [True, False])
def test_preserve_ordering_holds_later_batches(ordered):
    async def body():
        scheduler, (a, b), _ = scenario(
            f"preserve_ordering = {str(ordered).lower()}", instances=2, max_batch=1
        )
        first = scheduler.submit(make_request([[1, 1]]))
        second = scheduler.submit(make_request([[2, 2]]))
        await turn()
        b.finish()
        await turn()
        assert second.done() is not ordered
        a.finish()
        await turn()
        assert first.done() and second.done()

    run(body)


def test_cancelled_requests_do_not_run():
    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        scheduler.submit(make_request([[0, 0]]))
        await turn()
        gone = scheduler.submit(make_request([[1, 1]]))
        kept = scheduler.submit(make_request([[2, 2]]))
        gone.cancel()
        instance.finish()
        await turn()
        assert instance.batches[1].tolist() == [[2, 2]]
        instance.finish()
        await turn()
        assert lease_value(kept).tolist() == [[2, 2]]

    run(body)


def test_a_failed_batch_fails_exactly_its_requests():
    async def body():
        scheduler, (a, b), _ = scenario(None, instances=2)
        doomed = scheduler.submit(make_request([[1, 1]]))
        fine = scheduler.submit(make_request([[2, 2]]))
        await turn()
        a.fail("ValueError: boom")
        b.finish()
        await turn()
        with pytest.raises(InstanceError, match="model 'm' version 1: ValueError: boom"):
            doomed.result()
        assert lease_value(fine).tolist() == [[2, 2]]

    run(body)


def test_drain_waits_for_running_work_and_refuses_new():
    async def body():
        scheduler, (instance,), _ = scenario(None)
        running = scheduler.submit(make_request([[1, 1]]))
        await turn()
        drained = asyncio.ensure_future(scheduler.drain())
        await turn()
        assert not drained.done()
        with pytest.raises(SchedulerError, match="is unloading"):
            scheduler.submit(make_request([[2, 2]]))
        instance.finish()
        await turn()
        assert drained.done() and lease_value(running).tolist() == [[1, 1]]

    run(body)


def test_a_busy_instance_takes_a_full_batch_to_run_next_but_not_one_that_can_grow():
    async def body():
        scheduler, (instance,), _ = scenario(
            "max_queue_delay_microseconds = 0", max_batch=2, staging=1
        )
        futures = [scheduler.submit(make_request([[0, 0]]))]
        futures.append(scheduler.submit(make_request([[1, 1]])))
        await turn()
        assert len(instance.batches) == 1  # [1, 1] could still grow: it waits
        futures.append(scheduler.submit(make_request([[2, 2]])))
        await turn()
        assert instance.batches[1].tolist() == [[1, 1], [2, 2]]  # full: staged
        assert scheduler.pending == 2  # staged, not running: still awaiting execution
        futures += [scheduler.submit(make_request([[i, i]])) for i in (3, 4)]
        await turn()
        assert len(instance.batches) == 2  # one running, one staged: no room
        instance.finish()
        await turn()
        assert instance.batches[2].tolist() == [[3, 3], [4, 4]]
        instance.finish()
        instance.finish()
        await turn()
        assert [lease_value(f).tolist() for f in futures] == [[[i, i]] for i in range(5)]

    run(body)


def test_a_full_batch_holding_a_deadline_is_not_staged_and_its_expired_request_never_runs():
    async def body():
        scheduler, (instance,), clock = scenario(
            "max_queue_delay_microseconds = 0", max_batch=2, staging=1
        )
        running = scheduler.submit(make_request([[0, 0]]))
        await turn()
        expiring = scheduler.submit(make_request([[1, 1]], timeout_us=500))
        patient = scheduler.submit(make_request([[2, 2]]))
        await turn()
        assert len(instance.batches) == 1  # full, but a deadline in it: it stays queued
        clock.advance(600 * US)
        await turn()
        with pytest.raises(SchedulerError, match="timed out in the queue after 600 us"):
            expiring.result()
        instance.finish()
        await turn()
        assert instance.batches[1].tolist() == [[2, 2]]  # the rest of the batch runs
        instance.finish()
        await turn()
        assert [lease_value(f).tolist() for f in (running, patient)] == [[[0, 0]], [[2, 2]]]

    run(body)


def test_a_batch_handed_back_unstarted_runs_next_and_fails_nobody():
    async def body():
        scheduler, (instance,), _ = scenario(None, staging=1)
        crashed, staged, queued = (scheduler.submit(make_request([[i, i]])) for i in range(3))
        await turn()
        assert len(instance.batches) == 2
        # The process died running the first batch; the staged one never began.
        instance.fail("instance 0 was killed by SIGKILL", FailureCause.INSTANCE)
        instance.fail("instance 0 was killed by SIGKILL", FailureCause.NOT_STARTED)
        await turn()
        assert [b.tolist() for b in instance.batches[2:]] == [[[1, 1]], [[2, 2]]]
        instance.finish()
        instance.finish()
        await turn()
        with pytest.raises(InstanceError, match="SIGKILL"):
            crashed.result()
        assert lease_value(staged).tolist() == [[1, 1]] and lease_value(queued).tolist() == [[2, 2]]
        assert scheduler.pending == 0

    run(body)


def test_the_next_batch_is_sent_before_the_answered_requests_read_their_outputs():
    """The instance runs the next batch while the front encodes the last one's answers:
    it is sent from the answer itself, not a turn of the loop later, behind every
    answered request's task."""

    async def body():
        scheduler, (instance,), _ = scenario("max_queue_delay_microseconds = 0")
        first = scheduler.submit(make_request([[1, 1]]))
        await turn()
        waiting = scheduler.submit(make_request([[2, 2]]))
        await turn()
        assert len(instance.batches) == 1
        instance.finish()
        # no turn of the loop yet: sent from within the answer
        assert [batch.tolist() for batch in instance.batches] == [[[1, 1]], [[2, 2]]]
        await turn()
        instance.finish()
        await turn()
        assert lease_value(first).tolist() == [[1, 1]] and lease_value(waiting).tolist() == [[2, 2]]

    run(body)
