"""Leases on outputs in shared memory, without processes: a batch's slot goes back to its
instance only once every lease cut from it is released, and no way a caller can leave
(cancelled after its lease was set, a client gone mid-stream, an error while encoding)
keeps a slot."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest

from reposerve.errors import InstanceError, ProtocolError
from reposerve.http.access import AccessPolicy
from reposerve.http.generate import _documents
from reposerve.http.infer import InferEndpoint
from reposerve.instance.outcomes import BatchOutcome, SlotHold, StreamedResponse
from reposerve.repository.residency import Residency
from reposerve.scheduler.batcher import Scheduler
from reposerve.scheduler.lease import COPY_AHEAD, COPY_AHEAD_BYTES, LeaseStream, take
from reposerve.service import InferenceService
from reposerve.statistics import ModelStatistics
from reposerve.tensor import Tensor
from tests.scheduler_fakes import (
    DecoupledStandIn,
    FakeClock,
    lease_value,
    make_request,
    model_config,
    run,
    scenario,
    turn,
)

pytestmark = pytest.mark.unit

GATHER = "max_queue_delay_microseconds = 100"


def test_a_slot_is_given_back_only_once_every_lease_of_its_batch_is_released():
    async def body():
        scheduler, (instance,), clock = scenario(GATHER)
        futures = [scheduler.submit(make_request([[i, i]])) for i in range(3)]
        clock.advance(100_000)
        await turn()
        assert instance.batches[0].shape == (3, 2)  # one batch, one slot
        instance.finish()
        await turn()
        leases = [future.result() for future in futures]
        assert [lease.held for lease in leases] == [True] * 3 and instance.freed == []
        leases[2].release()
        leases[0].release()
        assert instance.freed == []  # one lease still reads the slot
        leases[0].release()  # twice is harmless, and frees nothing more
        assert instance.freed == []
        leases[1].release()
        assert instance.freed == [0]

    run(body)


def test_a_caller_cancelled_after_its_lease_was_set_releases_it():
    async def body():
        scheduler, (instance,), _ = scenario(None)

        async def caller() -> None:
            with await scheduler.lease(make_request([[1, 1]])):
                pytest.fail("a cancelled caller never reads its lease")

        task = asyncio.ensure_future(caller())
        await turn()
        instance.finish()  # the lease is set; the caller has not resumed yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert instance.freed == [0]

    run(body)


def test_a_failed_request_leaves_no_cycle_to_keep_its_callers_memory():
    """The error's traceback holds the awaiting frames (a model call's hold views on its
    caller's shared memory): the future must not be in one of them, or the cycle keeps
    them, and the memory's descriptors, until the collector runs."""

    async def body():
        scheduler, (instance,), _ = scenario(None)
        future = scheduler.submit(make_request([[1, 1]]))
        await turn()
        instance.fail("ValueError: boom")
        with pytest.raises(InstanceError, match="boom"):
            await take(future)
        gone = weakref.ref(future)
        del future
        await turn()  # its done callbacks run
        assert gone() is None

    gc.disable()
    try:
        run(body)
    finally:
        gc.enable()


def test_a_caller_gone_before_its_batch_ended_holds_nothing_and_the_rest_read_on():
    async def body():
        scheduler, (instance,), clock = scenario(GATHER)
        gone, kept = (scheduler.submit(make_request([[i, i]])) for i in range(2))
        clock.advance(100_000)
        await turn()
        gone.cancel()  # its client left while its batch ran
        instance.finish()
        await turn()
        assert instance.freed == []  # the other request's lease still reads the slot
        assert lease_value(kept).tolist() == [[1, 1]]
        assert instance.freed == [0]

    run(body)


def test_a_lease_held_back_for_ordering_is_copied_out_and_frees_its_slot_at_once():
    async def body():
        scheduler, (a, b), _ = scenario("preserve_ordering = true", instances=2, max_batch=1)
        first, second = (scheduler.submit(make_request([[i, i]])) for i in (1, 2))
        await turn()
        b.finish()
        await turn()
        assert not second.done() and b.freed == [0]  # waits for the first, in a copy
        a.finish()
        await turn()
        assert lease_value(first).tolist() == [[1, 1]] and lease_value(second).tolist() == [[2, 2]]
        assert a.freed == [0]

    run(body)


def _model(scheduler: Scheduler, decoupled: bool) -> SimpleNamespace:
    """What the service reads of a loaded model version."""
    config = msgspec.structs.replace(model_config(None), decoupled=decoupled)
    return SimpleNamespace(
        name="m",
        config=config,
        scheduler=scheduler,
        instance_scheduler=scheduler,  # it runs in instances: no ensemble
        output_names=("Y",),
        labels={},
        version_text="1",
    )


def _service(model: SimpleNamespace) -> InferenceService:
    async def serving(name: str, version: str | None) -> SimpleNamespace:
        return model

    repository = SimpleNamespace(serving=serving, residency=Residency())
    return InferenceService(repository)


def _decoupled_model() -> tuple[SimpleNamespace, DecoupledStandIn]:
    instance = DecoupledStandIn()
    config = model_config(None)
    scheduler = Scheduler(
        "model 'm' version 1", config, [instance], ModelStatistics("m", 1), FakeClock()
    )
    return _model(scheduler, decoupled=True), instance


GENERATE = b'{"X": [0, 0]}'


async def _reading(documents: bool) -> tuple[DecoupledStandIn, AsyncIterator, asyncio.Future]:
    """A generate request to a decoupled model: its instance, its answers (``documents``:
    the HTTP front's JSON documents of them), and a task reading the first."""
    model, instance = _decoupled_model()
    answers = await _service(model).generate("m", None, GENERATE)
    responses = _documents(answers, "m") if documents else answers
    reading = asyncio.ensure_future(anext(responses))
    await turn()
    return instance, responses, reading


async def _streaming() -> tuple[DecoupledStandIn, LeaseStream]:
    """A decoupled model's instance and the lease stream of one request running on it."""
    model, instance = _decoupled_model()
    stream = model.scheduler.stream(make_request([[0, 0]]))
    await turn()
    return instance, stream


def test_small_responses_are_copied_ahead_until_the_stream_holds_four():
    async def body():
        instance, stream = await _streaming()
        for step in range(COPY_AHEAD):  # copied out: the instance goes straight on
            instance.respond(step)
            assert instance.resumed == step + 1
        instance.respond(COPY_AHEAD)  # the stream is full: this one holds the slot
        assert instance.resumed == COPY_AHEAD
        for step in range(COPY_AHEAD + 1):
            with await anext(stream) as lease:
                assert lease.held == (step == COPY_AHEAD)
                assert np.frombuffer(lease.outputs["Y"].raw, np.float32).tolist() == [step] * 2
            assert instance.resumed == COPY_AHEAD + (step == COPY_AHEAD)

    run(body)


def test_a_large_response_is_not_copied_its_instance_waits_until_it_is_released():
    async def body():
        instance, stream = await _streaming()
        _, on_event = instance.batches[0]
        large = np.zeros((1, COPY_AHEAD_BYTES // 4 + 1), np.float32)
        outputs = {"Y": Tensor("FP32", large.shape, memoryview(large.tobytes()))}
        on_event(StreamedResponse(outputs, resume=instance._resume))
        assert instance.resumed == 0
        with await anext(stream) as lease:
            assert lease.held and lease.nbytes == large.nbytes
        assert instance.resumed == 1

    run(body)


def test_a_client_leaving_mid_stream_releases_the_response_it_had_not_taken():
    async def body():
        instance, answers, reading = await _reading(documents=False)
        for step in range(COPY_AHEAD + 1):
            instance.respond(step)
        assert instance.resumed == COPY_AHEAD  # the last one holds the slot, never taken
        with await reading:
            pass
        await answers.aclose()  # the client left
        assert instance.resumed == COPY_AHEAD + 1 and instance.cancelled == [8]

    run(body)


def test_a_client_leaving_while_waiting_for_a_response_cancels_its_generation():
    async def body():
        instance, _, waiting = await _reading(documents=True)
        waiting.cancel()  # a disconnect while the front waits for the next response
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert instance.cancelled == [8]
        instance.respond(0)  # what the model sent before it saw the cancel
        assert instance.resumed == 1

    run(body)


def test_an_error_encoding_a_streamed_response_releases_it_and_stops_the_generation():
    async def body():
        instance, _, reading = await _reading(documents=True)
        instance.respond(np.nan)  # JSON cannot carry NaN
        with pytest.raises(ProtocolError, match="output 'Y' holds NaN"):
            await reading
        assert instance.resumed == 1 and instance.cancelled == [8]

    run(body)


def test_an_error_encoding_a_response_releases_it_and_answers_the_error():
    async def body():
        scheduler, (instance,), _ = scenario(None)
        endpoint = InferEndpoint(_service(_model(scheduler, False)), AccessPolicy([]), 1 << 20)
        body = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}'
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "path": "/v2/models/m/infer", "headers": []}
        scope["path_params"] = {"model": "m"}
        serving = asyncio.ensure_future(endpoint(scope, receive, send))
        await turn()
        _, on_event = instance._take(0)
        nan = np.full((1, 2), np.nan, np.float32)
        slot = SlotHold(lambda: instance.freed.append(0))
        on_event(BatchOutcome({"Y": Tensor("FP32", nan.shape, memoryview(nan.tobytes()))}, 0, slot))
        slot.release()
        await serving
        assert sent[0]["status"] == 400 and b"holds NaN" in sent[1]["body"]
        assert instance.freed == [0]

    run(body)
