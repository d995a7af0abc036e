"""The sequence batcher's bookkeeping with stand-in instances and a fake clock: every
admitted request ends in one outcome, whatever its caller or the version does meanwhile."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from reposerve.config import parse_model_config
from reposerve.errors import SchedulerError
from reposerve.scheduler.sequences import SequenceBatcher
from reposerve.statistics import ModelStatistics
from tests.scheduler_fakes import FakeClock, StandInInstance, make_request, run, turn

pytestmark = pytest.mark.unit

CONFIG = """
    max_batch_size = 4
    [[input]]
    name = "X"
    datatype = "FP32"
    shape = [2]
    [[output]]
    name = "Y"
    datatype = "FP32"
    shape = [2]
    [sequence_batching]
    strategy = "oldest"
    max_candidate_sequences = 1
    max_sequence_idle_microseconds = 1000000
"""


def _batcher() -> tuple[SequenceBatcher, StandInInstance, FakeClock]:
    clock = FakeClock()
    config = parse_model_config(CONFIG, "m/config.toml")
    batcher = SequenceBatcher(
        "model 'm' version 1", "m", config, ModelStatistics("m", 1), None, clock
    )
    instance = StandInInstance()
    batcher.add_instance(instance)
    return batcher, instance, clock


def _request(key: int | str, start: bool = False, end: bool = False):
    request = make_request([[1.0, 2.0]])
    return msgspec.structs.replace(request, sequence_id=key, sequence_start=start, sequence_end=end)


def test_a_request_cancelled_before_it_ran_leaves_nothing_behind():
    async def test() -> None:
        batcher, instance, clock = _batcher()
        batcher.submit(_request(1, start=True)).cancel()  # its caller left at once
        await turn()
        assert batcher.pending == 0 and not instance.batches
        clock.advance(2_000_000_000)  # the idle sequence is released: its slot is free
        second = batcher.submit(_request(2, start=True, end=True))
        await turn()
        instance.finish()
        await turn()
        second.result().release()
        await asyncio.wait_for(batcher.drain(), 1)

    run(test)


def test_abort_answers_the_backlog_and_the_requests_behind_it():
    async def test() -> None:
        batcher, instance, _ = _batcher()
        first = batcher.submit(_request(1, start=True))  # holds the only slot
        await turn()
        instance.finish()
        await turn()
        first.result().release()
        assert batcher.busy  # an open sequence: its model must not be evicted
        waiting = batcher.submit(_request(2, start=True))  # in the backlog
        behind = batcher.submit(_request(2))  # waits for its turn behind it
        await turn()
        batcher.abort(SchedulerError("model 'm' version 1 is unloading"))
        batcher.remove_instance(instance)
        for future in (waiting, behind):
            with pytest.raises(SchedulerError, match="unloading"):
                await asyncio.wait_for(future, 1)
        await asyncio.wait_for(batcher.drain(), 1)

    run(test)


def test_one_row_per_request_of_a_sequence():
    async def test() -> None:
        batcher, _, _ = _batcher()
        two_rows = msgspec.structs.replace(
            make_request([[1.0, 2.0], [3.0, 4.0]]), sequence_id=5, sequence_start=True
        )
        with pytest.raises(SchedulerError, match="must specify batch-size 1 due to requirements"):
            batcher.submit(two_rows)

    run(test)


async def _hold_the_slot(batcher: SequenceBatcher, instance: StandInInstance) -> None:
    """Sequence 1 started: it holds the only slot (until it ends or idles 1 s)."""
    first = batcher.submit(_request(1, start=True))
    await turn()
    instance.finish()
    await turn()
    first.result().release()


def test_a_start_whose_caller_left_as_it_was_given_a_slot_gives_it_back():
    async def test() -> None:
        batcher, instance, clock = _batcher()
        await _hold_the_slot(batcher, instance)
        waiting = batcher.submit(_request(2, start=True))
        await turn()
        clock.advance(1_000_000_000)  # sequence 1 idles out: its slot goes to sequence 2
        waiting.cancel()  # and its caller leaves before it resumes
        await turn()
        assert not batcher.busy  # nothing of sequence 2 reached the model: nothing kept
        fresh = batcher.submit(_request(3, start=True, end=True))
        await turn()
        assert len(instance.batches) == 2  # it has the slot at once
        instance.finish()
        await turn()
        fresh.result().release()
        await asyncio.wait_for(batcher.drain(), 1)

    run(test)


def test_requests_behind_a_start_withdrawn_before_it_ran_never_run_without_one():
    async def test() -> None:
        batcher, instance, clock = _batcher()
        await _hold_the_slot(batcher, instance)
        start = batcher.submit(_request(2, start=True))
        behind = batcher.submit(_request(2))  # received for the same sequence
        await turn()
        start.cancel()  # its client leaves while it waits for a slot
        with pytest.raises(SchedulerError, match="the request that started it left before"):
            await asyncio.wait_for(behind, 1)
        assert batcher.pending == 0
        clock.advance(1_000_000_000)  # sequence 1 idles out: the slot is free
        await turn()
        assert len(instance.batches) == 1  # nothing of sequence 2 reached the model
        with pytest.raises(SchedulerError, match="must specify the START flag"):
            batcher.submit(_request(2))
        await asyncio.wait_for(batcher.drain(), 1)

    run(test)


def test_a_timeout_ends_a_sequence_still_waiting_for_a_slot():
    async def test() -> None:
        batcher, instance, clock = _batcher()
        await _hold_the_slot(batcher, instance)
        timed = msgspec.structs.replace(_request(2, start=True), timeout_us=200_000)
        waiting = batcher.submit(timed)
        behind = batcher.submit(_request(2))  # received for the same sequence
        await turn()
        clock.advance(199_999_000)
        assert not waiting.done()
        clock.advance(1_000)
        for future in (waiting, behind):
            with pytest.raises(SchedulerError) as caught:
                await asyncio.wait_for(future, 1)
            assert caught.value.message == (
                "model 'm' version 1: timeout of sequence 2 expired: a request of it waited "
                "200000 us (its timeout parameter) without a sequence slot, so the sequence "
                "and its requests were dropped; start it again"
            )
        assert batcher.pending == 0
        with pytest.raises(SchedulerError, match="must specify the START flag"):
            batcher.submit(_request(2))
        # The sequence holding the slot goes on: a timeout does not count once it has one.
        held = batcher.submit(msgspec.structs.replace(_request(1, end=True), timeout_us=1))
        await turn()
        clock.advance(1_000_000)
        instance.finish()
        await turn()
        held.result().release()
        await asyncio.wait_for(batcher.drain(), 1)

    run(test)


CORRID_CONFIG = (
    CONFIG
    + """
    [[sequence_batching.control_input]]
    name = "CORRID"
    kind = "corrid"
    datatype = "UINT64"
"""
)


def test_a_numeric_corrid_makes_one_sequence_of_each_id_the_model_sees():
    async def test() -> None:
        config = parse_model_config(CORRID_CONFIG, "m/config.toml")
        batcher = SequenceBatcher("model 'm' version 1", "m", config, ModelStatistics("m", 1))
        batcher.add_instance(StandInInstance())
        started = batcher.submit(_request("7", start=True))
        following = batcher.submit(_request(7))  # the same sequence: the model sees 7
        for alias in ("07", "+7", " 7", "7.0", "٧"):
            with pytest.raises(SchedulerError) as caught:
                batcher.submit(_request(alias, start=True))
            assert caught.value.message == (
                f"model 'm': correlation id '{alias}' is a string; its CORRID control is "
                "UINT64, so the id must be an integer, as an int or a string of its decimal "
                "digits with no sign or leading zeros"
            )
        for task in (started, following):
            task.cancel()
        await turn()

    run(test)


def test_a_sequence_released_for_idling_tells_its_next_request_why():
    async def test() -> None:
        batcher, instance, clock = _batcher()
        await _hold_the_slot(batcher, instance)
        clock.advance(1_000_000_000)  # sequence 1 idles out
        with pytest.raises(SchedulerError) as refused:
            batcher.submit(_request(1)).result()
        assert refused.value.kind.name == "INVALID_ARGUMENT"
        assert "must specify the START flag" in refused.value.message
        assert "released after 1000000 us without a request" in refused.value.message
        again = batcher.submit(_request(1, start=True, end=True))  # a START begins it anew
        await turn()
        instance.finish()
        await turn()
        again.result().release()
        await asyncio.wait_for(batcher.drain(), 1)

    run(test)
