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


def _request(key: int, start: bool = False, end: bool = False):
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
