"""Streamed responses without processes: the gRPC outbox's buffer and backpressure, the
scheduler handing a decoupled batch's responses to each request as leases, holding the
instance until they are released, cancelling it when every client has gone, and the
generate extension's request rules."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from reposerve.config import parse_model_config
from reposerve.errors import ProtocolError, SchedulerError
from reposerve.grpc.outbox import Outbox
from reposerve.instance.outcomes import (
    BatchFailure,
    FailureCause,
    SlotHold,
)
from reposerve.protocol.generate import decode_generate, encode_generate
from reposerve.scheduler.batcher import Scheduler
from reposerve.scheduler.lease import COPY_AHEAD, Lease, LeaseStream
from reposerve.statistics import ModelStatistics
from reposerve.tensor import Tensor
from tests.scheduler_fakes import DecoupledStandIn, FakeClock, make_request, model_config, run, turn

pytestmark = pytest.mark.unit


async def _drain(stream) -> list:
    return [response async for response in stream]


async def _values(stream: LeaseStream) -> list:
    """Every response left, each lease read and released."""
    return [_value(lease) async for lease in stream]


def _value(lease: Lease) -> list[float]:
    with lease:
        return np.frombuffer(lease.outputs["Y"].raw, np.float32).tolist()


def test_an_outbox_gives_its_responses_in_order_then_its_error():
    async def body():
        outbox: Outbox[int] = Outbox(limit=2)
        outbox.put(1)
        outbox.put(2)
        outbox.end(SchedulerError("gone"))
        outbox.put(3)  # after the end: dropped
        received = []
        with pytest.raises(SchedulerError, match="gone"):
            async for response in outbox:
                received.append(response)
        assert received == [1, 2]

    run(body)


def test_a_full_outbox_makes_its_writer_wait_until_its_reader_makes_room():
    async def body():
        outbox: Outbox[int] = Outbox(limit=2)
        outbox.put(1)
        await outbox.room()  # not full yet: at once
        outbox.put(2)
        waiting = asyncio.ensure_future(outbox.room())
        await turn()
        assert not waiting.done()
        assert await anext(outbox) == 1
        await turn()
        assert waiting.done()

    run(body)


def test_cancelling_a_lease_stream_releases_its_leases_and_tells_its_producer_unless_ended():
    async def body():
        cancelled, freed = [], []
        live = LeaseStream()
        live.on_cancel = lambda: cancelled.append("live")
        live.put(Lease({}, {}, SlotHold(lambda: freed.append("taken")).share()))
        live.cancel()
        assert await _drain(live) == []
        assert freed == [] and cancelled == ["live"]  # the slot's first share is not its
        ended = LeaseStream()
        ended.on_cancel = lambda: cancelled.append("ended")
        ended.end()
        ended.put(Lease({}, {}, SlotHold(lambda: freed.append("late"))))  # after the end
        ended.cancel()
        assert cancelled == ["live"] and freed == ["late"]

    run(body)


def _decoupled(batching: str = "preferred_batch_size = [2]\nmax_queue_delay_microseconds = 100"):
    instance = DecoupledStandIn()
    scheduler = Scheduler(
        "model 'm' version 1",
        model_config(batching),
        [instance],
        ModelStatistics("m", 1),
        FakeClock(),
    )
    return scheduler, instance


def _stream_two(scheduler: Scheduler) -> list[LeaseStream]:
    """Two streamed requests, [[0, 0]] and [[1, 1]]."""
    return [scheduler.stream(make_request([[index, index]])) for index in range(2)]


def test_each_request_of_a_decoupled_batch_gets_its_rows_of_every_response_in_order():
    async def body():
        scheduler, instance = _decoupled()
        streams = _stream_two(scheduler)
        await turn()
        (batch,) = [batch for batch, _ in instance.batches]
        assert batch.tolist() == [[0, 0], [1, 1]]  # batched together
        received: list[list] = [[], []]
        for step in range(3):
            instance.respond(10 * step)
            for index, stream in enumerate(streams):
                received[index].append(_value(await anext(stream)))
        instance.end()
        for index, stream in enumerate(streams):
            received[index] += await _values(stream)
        assert received == [[[0, 0], [10, 10], [20, 20]], [[1, 1], [11, 11], [21, 21]]]
        assert instance.resumed == 3

    run(body)


def test_a_response_holds_the_instance_until_every_lease_of_it_is_released():
    async def body():
        scheduler, instance = _decoupled()
        streams = _stream_two(scheduler)
        await turn()
        for step in range(COPY_AHEAD):
            instance.respond(step)
        assert instance.resumed == COPY_AHEAD  # small ones are copied out: it goes on
        instance.respond(COPY_AHEAD)  # both streams are full: it waits
        assert instance.resumed == COPY_AHEAD
        for stream in streams:  # what was copied holds nothing
            for _ in range(COPY_AHEAD):
                assert not (await anext(stream)).held
        first = await anext(streams[0])
        assert _value(first) == [COPY_AHEAD, COPY_AHEAD]
        assert instance.resumed == COPY_AHEAD  # the other stream still holds its lease
        second = await anext(streams[1])
        assert instance.resumed == COPY_AHEAD  # taken is not released
        second.release()
        assert instance.resumed == COPY_AHEAD + 1

    run(body)


def test_a_decoupled_batch_is_cancelled_once_all_its_clients_have_gone():
    async def body():
        scheduler, instance = _decoupled()
        streams = _stream_two(scheduler)
        await turn()
        streams[0].cancel()
        assert instance.cancelled == []  # the other client still reads
        for step in range(COPY_AHEAD + 1):
            instance.respond(step)
        assert instance.resumed == COPY_AHEAD  # the other client's last lease is out
        streams[1].cancel()
        assert instance.cancelled == [8]
        assert instance.resumed == COPY_AHEAD + 1  # released by the cancel
        instance.end()  # the instance ends the batch after the cancel
        assert [await _drain(stream) for stream in streams] == [[], []]
        await scheduler.drain()

    run(body)


def test_a_decoupled_batch_failing_after_a_response_is_not_run_again():
    """Isolation reruns halves of a failed batch; one that has sent responses must not
    run again (its clients would get them twice): each request gets the error."""

    async def body():
        scheduler, instance = _decoupled()
        streams = _stream_two(scheduler)
        await turn()
        instance.respond(0)
        instance.end(BatchFailure("boom", FailureCause.MODEL))
        await turn()
        assert instance.batches == []
        for index, stream in enumerate(streams):
            assert _value(await anext(stream)) == [index, index]
            with pytest.raises(Exception, match="boom"):
                await anext(stream)

    run(body)


GENERATE_CONFIG = """
    max_batch_size = 4
    [[input]]
    name = "text"
    datatype = "BYTES"
    shape = [1]
    [[input]]
    name = "grid"
    datatype = "INT32"
    shape = [2, -1]
    optional = true
    [[output]]
    name = "out"
    datatype = "FP32"
    shape = [-1]
"""


def test_generate_keys_are_inputs_or_parameters_and_shapes_fill_innermost_dynamic_dims():
    config = parse_model_config(GENERATE_CONFIG, "m/config.toml")
    request = decode_generate(
        b'{"text": "hi", "grid": [1, 2, 3, 4, 5, 6], "priority": 0, "id": "x",'
        b' "parameters": {"timeout": 5}}',
        config,
        "m",
    )
    assert request.id == "x" and request.timeout_us == 5
    assert request.inputs["text"].shape == (1, 1)
    assert request.inputs["grid"].shape == (1, 2, 3)
    with pytest.raises(ProtocolError, match="input 'grid': 5 values do not fill its shape"):
        decode_generate(b'{"text": "hi", "grid": [1, 2, 3, 4, 5]}', config, "m")


TYPED_CONFIG = parse_model_config(
    """
    max_batch_size = 0
    [[input]]
    name = "PROMPT"
    datatype = "BYTES"
    shape = [1, 1]
    [[input]]
    name = "STREAM"
    datatype = "BOOL"
    shape = [1, 1]
    [[input]]
    name = "COUNT"
    datatype = "UINT32"
    shape = [1]
    optional = true
    [[output]]
    name = "TEXT"
    datatype = "BYTES"
    shape = [-1]
    """,
    "m/config.toml",
)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"PROMPT": "a", "STREAM": false, "PROMPT": "b"}',
            "input 'PROMPT' is given more than once in the generate request (input 'PROMPT' "
            "already exists in request)",
        ),
        # the first key repeated, in document order
        (b'{"PROMPT": "a", "STREAM": false, "STREAM": true, "PROMPT": "b"}', "input 'STREAM'"),
        # an input given at the top and again in parameters is one input given twice
        (b'{"PROMPT": "a", "STREAM": true, "parameters": {"PROMPT": "b"}}', "input 'PROMPT'"),
        # a key spelt with an escape is the same key
        (b'{"PROMPT": "a", "STREAM": true, "\\u0050ROMPT": "b"}', "input 'PROMPT'"),
        (
            b'{"PROMPT": "a", "STREAM": true, "parameters": {"x": 1}, "x": 2}',
            "parameter 'x' already exists in request",
        ),
        (
            b'{"PROMPT": "a", "STREAM": true, "parameters": {"x": 1}, "parameters": {"y": 2}}',
            "keyword 'parameters' is given more than once",
        ),
    ],
)
def test_a_generate_key_given_twice_is_refused_not_dropped(body, message):
    with pytest.raises(ProtocolError) as raised:
        decode_generate(body, TYPED_CONFIG, "m")
    assert message in str(raised.value)


def test_generate_keys_are_counted_only_where_they_are_keys():
    # A key's name inside a string (escaped quotes and all) or as a value is no key.
    request = decode_generate(
        b'{"PROMPT": ["\\"PROMPT\\": 1, \\\\"], "STREAM": [true], "note": "STREAM",'
        b' "parameters": {"x": 1, "y": "x"}}',
        TYPED_CONFIG,
        "m",
    )
    assert request.parameters == {"note": "STREAM", "x": 1, "y": "x"}
    assert bytes(request.inputs["PROMPT"].raw)[4:] == b'"PROMPT": 1, \\'
    # Nor are the keys of an object deeper than the request's own or its parameters'.
    with pytest.raises(ProtocolError, match="parameter 'PARAMS' has invalid type"):
        decode_generate(
            b'{"PROMPT": "a", "STREAM": true, "PARAMS": {"PROMPT": 1, "PROMPT": 2}}',
            TYPED_CONFIG,
            "m",
        )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"PROMPT": 123, "STREAM": false}', "attempt to access JSON non-string as string"),
        (b'{"PROMPT": "a", "STREAM": "false"}', "attempt to access JSON non-boolean as boolean"),
        # the first input in document order is the one named
        (b'{"PROMPT": true, "STREAM": 123}', "attempt to access JSON non-string as string"),
        (b'{"STREAM": 123, "PROMPT": true}', "attempt to access JSON non-boolean as boolean"),
        (
            b'{"PROMPT": {"USER": "a"}, "STREAM": true}',
            "input 'PROMPT': a generate request gives a scalar or a flat array (attempt to "
            "access JSON non-string as string)",
        ),
        (
            b'{"PROMPT": "a", "STREAM": true, "COUNT": 1.5}',
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            b'{"PROMPT": "a", "STREAM": true, "parameters": {"nested": {"twice": 1}}}',
            "Converting keyword: 'parameters': parameter 'nested' has invalid type.",
        ),
        (
            b'{"PROMPT": "a", "STREAM": true, "PARAMS": {"P": 0}}',
            "'PARAMS' is not an input of the model, and as a parameter it must be a string, "
            "number or bool (parameter 'PARAMS' has invalid type.)",
        ),
    ],
)
def test_generate_values_of_the_wrong_kind_are_refused_in_tritons_words(body, message):
    with pytest.raises(ProtocolError) as raised:
        decode_generate(body, TYPED_CONFIG, "m")
    assert message in str(raised.value)


def test_generate_responses_are_flat_and_one_element_is_a_bare_value():
    one = np.array([1.5], np.float32)
    many = np.arange(4, dtype=np.float32).reshape(2, 2)
    document = encode_generate(
        "m",
        "1",
        None,
        [
            ("one", Tensor("FP32", one.shape, memoryview(one.tobytes()))),
            ("many", Tensor("FP32", many.shape, memoryview(many.tobytes()))),
        ],
    )
    assert document == b'{"model_name":"m","model_version":"1","one":1.5,"many":[0.0,1.0,2.0,3.0]}'
    nan = np.array([np.nan], np.float32)
    with pytest.raises(ProtocolError, match="output 'bad' holds NaN"):
        encode_generate("m", "1", None, [("bad", Tensor("FP32", (1,), memoryview(nan.tobytes())))])


ORDERED = "preserve_ordering = true"


def test_under_preserve_ordering_a_cancelled_stream_holds_back_no_later_one():
    async def body():
        scheduler, instance = _decoupled(ORDERED)
        first = scheduler.stream(make_request([[0, 0]]))
        await turn()
        first.cancel()  # its client leaves while its batch runs
        instance.end()
        later = scheduler.stream(make_request([[1, 1]]))
        await turn()
        instance.respond(0)
        instance.end()
        assert await _values(later) == [[1, 1]]  # and it ended

    run(body)


def test_a_client_that_gives_up_mid_stream_stops_its_generation_counted_once():
    """Say its response cannot be encoded (NaN in generate's JSON): the front releases
    the lease and cancels the stream; nobody wants more, so the batch is cancelled, and
    the request counts as one failure."""

    async def body():
        scheduler, instance = _decoupled(ORDERED)
        stream = scheduler.stream(make_request([[0, 0]]))
        await turn()
        instance.respond(0)
        lease = await anext(stream)
        with pytest.raises(ProtocolError), lease:  # the front's encoding fails
            raise ProtocolError("output 'Y' holds NaN")
        assert instance.resumed == 1
        stream.cancel()
        assert instance.cancelled == [8]
        instance.end(BatchFailure("it went on and failed", FailureCause.INSTANCE))
        await turn()
        assert await _drain(stream) == []
        assert sum(scheduler._statistics.failures.values()) == 1

    run(body)


def test_a_rerun_to_isolate_a_fault_leaves_out_requests_whose_clients_left():
    async def body():
        scheduler, instance = _decoupled()
        streams = _stream_two(scheduler)
        await turn()
        streams[0].cancel()  # the other client stays: the batch goes on
        instance.end(BatchFailure("boom", FailureCause.MODEL))  # before any response
        await turn()
        assert [batch.tolist() for batch, _ in instance.batches] == [[[1, 1]]]

    run(body)
