"""The front's handle on a real instance process (``InstanceProcess``), without a server:
a batch's outcome in its slot, and when the process ends (by itself, or killed past the
execution timeout) exactly its batches fail, the one staged behind sent back unrun, and
its owner told how it ended."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from functools import partial

import numpy as np
import pytest

from reposerve.errors import InstanceError
from reposerve.instance.messages import Result
from reposerve.instance.outcomes import (
    BatchFailure,
    BatchOutcome,
    BatchTensor,
    FailureCause,
    SlotHold,
    outcome_to,
)
from reposerve.instance.process import InstanceProcess, InstanceState
from reposerve.instance.spec import InstanceSpec
from reposerve.tensor import Tensor
from tests.toy_models import CRASH, HANGS, PLUS_ONE, vector_config

pytestmark = pytest.mark.integration

TIMEOUT_S = 60  # for the process to load, or to end; a test that passes waits for events


def _item(first: float) -> list[BatchTensor]:
    """One FP32[16] item starting with ``first`` (CRASH and HANGS read it)."""
    values = np.arange(16, dtype=np.float32)
    values[0] = first
    return [BatchTensor("INPUT", "FP32", (1, 16), [values.tobytes()])]


async def _ended(spec: InstanceSpec, run: Callable[[InstanceProcess, dict], None]) -> tuple:
    """Start an instance, ``run`` batches on it (outcomes into a dict), and wait until its
    owner is told the process ended: the outcomes and the instance."""
    gone = asyncio.Event()
    instance = InstanceProcess(spec, lambda _: gone.set())
    await instance.start(TIMEOUT_S)
    outcomes: dict[str, BatchOutcome | BatchFailure] = {}
    try:
        run(instance, outcomes)
        await asyncio.wait_for(gone.wait(), TIMEOUT_S)
    finally:
        await instance.stop(5)
    return outcomes, instance


def test_a_process_that_dies_fails_its_batch_and_sends_back_the_staged_one(python_model):
    spec = python_model(CRASH, vector_config())

    def run(instance: InstanceProcess, outcomes: dict) -> None:
        instance.run(_item(666), outcome_to(partial(outcomes.__setitem__, "dies")))
        assert instance.has_capacity(staged=True) and not instance.has_capacity()
        instance.run(_item(1), outcome_to(partial(outcomes.__setitem__, "staged")))

    outcomes, instance = asyncio.run(_ended(spec, run))
    how = "exited with code 3"
    assert outcomes == {
        "dies": BatchFailure(
            f"instance 0 (pid {instance.pid}) {how} while running this batch",
            FailureCause.INSTANCE,
        ),
        "staged": BatchFailure(
            f"instance 0 (pid {instance.pid}) {how} while running this batch",
            FailureCause.NOT_STARTED,
        ),
    }
    assert instance.ended == how and not instance.batch_fault
    assert instance.in_flight == 0 and instance.state is InstanceState.EXITED


def test_a_batch_past_the_timeout_is_failed_and_its_process_killed(python_model):
    spec = python_model(HANGS, vector_config(), execute_timeout_s=1)

    def run(instance: InstanceProcess, outcomes: dict) -> None:
        def answered(outcome: BatchOutcome | BatchFailure) -> None:
            outcomes["fine"] = outcome
            # Then one that hangs, and one staged behind it.
            instance.run(_item(13), outcome_to(partial(outcomes.__setitem__, "hangs")))
            instance.run(_item(2), outcome_to(partial(outcomes.__setitem__, "staged")))

        instance.run(_item(1), outcome_to(answered))

    outcomes, instance = asyncio.run(_ended(spec, run))
    fine = outcomes["fine"]
    assert isinstance(fine, BatchOutcome)  # its outputs were views valid only while received
    assert outcomes["hangs"] == BatchFailure(
        "execute did not finish within 1 s (execution.timeout_seconds); the instance was "
        "killed and is being replaced",
        FailureCause.INSTANCE,
    )
    assert outcomes["staged"] == BatchFailure(
        "instance 0 was killed: another batch on it ran past execution.timeout_seconds (1 s)",
        FailureCause.NOT_STARTED,
    )
    assert instance.batch_fault and instance.ended == "was killed by SIGKILL"


def test_a_result_whose_outputs_cannot_be_read_fails_its_batch_and_frees_its_slot(python_model):
    """The process says its outputs fill more of the slot than the file holds: the batch
    still gets one answer (a failure saying why), and its slot goes back."""
    spec = python_model(PLUS_ONE, vector_config())

    async def body() -> list[BatchOutcome | BatchFailure]:
        instance = InstanceProcess(spec, lambda _: None)
        await instance.start(TIMEOUT_S)
        answered: asyncio.Queue = asyncio.Queue()
        try:
            batch_id = instance.run(_item(1), outcome_to(answered.put_nowait))
            instance._on_message(Result(batch_id, 1 << 40, [], 0))  # before its real one
            outcomes = [await asyncio.wait_for(answered.get(), TIMEOUT_S)]
            instance.run(_item(2), outcome_to(answered.put_nowait))  # the slot is free again
            outcomes.append(await asyncio.wait_for(answered.get(), TIMEOUT_S))
        finally:
            await instance.stop(5)
        return outcomes

    lying, next_one = asyncio.run(body())
    assert isinstance(lying, BatchFailure) and lying.cause is FailureCause.INSTANCE
    assert "instance 0" in lying.message and "could not be read" in lying.message
    assert isinstance(next_one, BatchOutcome)


def test_a_batch_whose_outputs_are_still_read_leaves_the_next_batches_new_slots(python_model):
    """A reader slow to let go of its batch's outputs (a front still encoding them) keeps
    that slot, not the instance: the next batches get slots of their own, and what the
    reader holds is not written over."""
    spec = python_model(PLUS_ONE, vector_config())

    async def body() -> list[list[float]]:
        instance = InstanceProcess(spec, lambda _: None)
        await instance.start(TIMEOUT_S)
        answered: asyncio.Queue = asyncio.Queue()
        held: list[tuple[SlotHold, Tensor]] = []

        def keep(outcome: BatchOutcome | BatchFailure) -> None:
            assert isinstance(outcome, BatchOutcome)
            held.append((outcome.slot.share(), outcome.outputs["OUTPUT"]))
            answered.put_nowait(None)

        try:
            for first in (10, 20, 30):
                assert instance.has_capacity()
                instance.run(_item(first), outcome_to(keep))
                await asyncio.wait_for(answered.get(), TIMEOUT_S)
            seen = [np.frombuffer(output.raw, np.float32)[:2].tolist() for _, output in held]
        finally:
            for share, _ in held:
                share.release()
            await instance.stop(5)
        return seen

    assert asyncio.run(body()) == [[11, 2], [21, 2], [31, 2]]


SLEEPS_IN_LOAD = """
    import time

    class Model:
        def load(self, context):
            time.sleep(60)

        def execute(self, inputs):
            return inputs
"""


def test_a_start_that_times_out_leaves_no_error_behind_for_the_loop(python_model):
    """The process is killed past the load timeout; what its end reports after that goes
    to nobody, and nothing is left for the loop to complain about."""
    spec = python_model(SLEEPS_IN_LOAD, vector_config())

    async def body() -> list[dict]:
        complaints: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: complaints.append(context)
        )
        instance = InstanceProcess(spec, lambda _: None)
        with pytest.raises(InstanceError, match="did not load within 1 s"):
            await instance.start(1)
        while not instance.ended:  # the exit report, which once failed the start again
            await asyncio.sleep(0.05)
        await instance.stop(5)
        del instance  # its start's future goes with it: it says then if it held an error
        gc.collect()
        await asyncio.sleep(0)
        return complaints

    assert asyncio.run(body()) == []
