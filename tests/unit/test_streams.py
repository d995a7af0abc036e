"""Streamed responses without processes: the stream's buffer and backpressure, the
scheduler handing a decoupled batch's responses to each request, cancelling it when every
client has gone, and the generate extension's request rules."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from reposerve.config import parse_model_config
from reposerve.errors import ProtocolError, SchedulerError
from reposerve.instance.outcomes import BatchFailure, BatchOutcome, FailureCause, StreamedResponse
from reposerve.protocol.generate import decode_generate, encode_generate
from reposerve.scheduler.batcher import Scheduler
from reposerve.scheduler.stream import ResponseStream
from reposerve.statistics import ModelStatistics
from reposerve.tensor import Tensor
from tests.unit.test_scheduler import FakeClock, _config, _request, _turn, run

pytestmark = pytest.mark.unit


async def _drain(stream: ResponseStream) -> list:
    return [response async for response in stream]


def test_a_stream_gives_its_responses_in_order_then_its_error():
    async def body():
        stream: ResponseStream[int] = ResponseStream(limit=2)
        stream.put(1)
        stream.put(2)
        stream.end(SchedulerError("gone"))
        stream.put(3)  # after the end: dropped
        received = []
        with pytest.raises(SchedulerError, match="gone"):
            async for response in stream:
                received.append(response)
        assert received == [1, 2]

    run(body)


def test_a_full_stream_calls_back_once_its_reader_makes_room():
    async def body():
        stream: ResponseStream[int] = ResponseStream(limit=2)
        called = []
        stream.put(1)
        stream.when_room(lambda: called.append("at once"))  # not full yet
        stream.put(2)
        assert stream.full
        stream.when_room(lambda: called.append("later"))
        assert called == ["at once"]
        assert await anext(stream) == 1
        assert called == ["at once", "later"]

    run(body)


def test_cancelling_a_stream_tells_its_producer_unless_it_had_ended():
    async def body():
        cancelled = []
        live: ResponseStream[int] = ResponseStream()
        live.on_cancel = lambda: cancelled.append("live")
        live.put(1)
        live.cancel()
        assert not live.full and await _drain(live) == []
        ended: ResponseStream[int] = ResponseStream()
        ended.on_cancel = lambda: cancelled.append("ended")
        ended.end()
        ended.cancel()
        assert cancelled == ["live"]

    run(body)


class DecoupledStandIn:
    """An instance of a decoupled model: the test sends each response and ends batches."""

    per_request = False

    def __init__(self) -> None:
        self.batches: list[tuple[np.ndarray, Callable, Callable]] = []
        self.cancelled: list[int] = []

    @property
    def in_flight(self) -> int:
        return len(self.batches)

    def has_capacity(self, staged: bool = False) -> bool:
        return not self.batches

    def run(self, inputs, on_done, on_start=None, requests=(), on_response=None) -> int:
        (tensor,) = inputs
        batch = np.frombuffer(b"".join(tensor.parts), np.float32).reshape(tensor.shape)
        assert on_response is not None
        self.batches.append((batch, on_done, on_response))
        return 7 + len(self.batches)

    def respond(self, step: float, resume: Callable[[], None]) -> bool:
        batch, _, on_response = self.batches[0]
        values = batch + step
        outputs = {"Y": Tensor("FP32", values.shape, memoryview(values.tobytes()))}
        return on_response(StreamedResponse(outputs), resume)

    def end(self, outcome: BatchOutcome | BatchFailure | None = None) -> None:
        _, on_done, _ = self.batches.pop(0)
        on_done(outcome or BatchOutcome({}, 0))

    def cancel(self, batch_id: int) -> None:
        self.cancelled.append(batch_id)


def _decoupled(batching: str = "preferred_batch_size = [2]\nmax_queue_delay_microseconds = 100"):
    instance = DecoupledStandIn()
    scheduler = Scheduler(
        "model 'm' version 1", _config(batching), [instance], ModelStatistics("m", 1), FakeClock()
    )
    return scheduler, instance


def _submit_two(scheduler: Scheduler) -> tuple[list[ResponseStream], list[asyncio.Future]]:
    """Two streamed requests, [[0, 0]] and [[1, 1]]."""
    streams = [ResponseStream() for _ in range(2)]
    futures = [
        scheduler.submit(_request([[index, index]]), _value, stream)
        for index, stream in enumerate(streams)
    ]
    return streams, futures


def _value(outputs: dict[str, Tensor], parameters: dict) -> list[float]:
    return np.frombuffer(outputs["Y"].raw, np.float32).tolist()


def test_each_request_of_a_decoupled_batch_gets_its_rows_of_every_response_in_order():
    async def body():
        scheduler, instance = _decoupled()
        streams = [ResponseStream(limit=8) for _ in range(2)]
        futures = [
            scheduler.submit(_request([[index, index]]), _value, stream)
            for index, stream in enumerate(streams)
        ]
        await _turn()
        (batch,) = [batch for batch, _, _ in instance.batches]
        assert batch.tolist() == [[0, 0], [1, 1]]  # batched together
        for step in range(3):
            assert instance.respond(10 * step, lambda: None)
        instance.end()
        await asyncio.gather(*futures)
        for stream in streams:
            stream.end()
        assert await _drain(streams[0]) == [[0, 0], [10, 10], [20, 20]]
        assert await _drain(streams[1]) == [[1, 1], [11, 11], [21, 21]]

    run(body)


def test_a_full_stream_holds_the_instance_until_every_full_one_has_room():
    async def body():
        scheduler, instance = _decoupled()
        streams = [ResponseStream(limit=1) for _ in range(2)]
        for index, stream in enumerate(streams):
            scheduler.submit(_request([[index, index]]), _value, stream)
        await _turn()
        resumed = []
        assert not instance.respond(0, lambda: resumed.append(True))  # both are full now
        assert await anext(streams[0]) == [0, 0]
        assert resumed == []  # the other still holds its response
        assert await anext(streams[1]) == [1, 1]
        assert resumed == [True]

    run(body)


def test_a_decoupled_batch_is_cancelled_once_all_its_clients_have_gone():
    async def body():
        scheduler, instance = _decoupled()
        streams, futures = _submit_two(scheduler)
        await _turn()
        streams[0].cancel()
        assert instance.cancelled == []  # the other client still reads
        assert instance.respond(1, lambda: None)
        streams[1].cancel()
        assert instance.cancelled == [8]
        instance.end()  # the instance ends the batch after the cancel
        assert all(future.cancelled() for future in futures)
        await scheduler.drain()

    run(body)


def test_a_decoupled_batch_failing_after_a_response_is_not_run_again():
    """Isolation reruns halves of a failed batch; one that has sent responses must not
    run again (its clients would get them twice): each request gets the error."""

    async def body():
        scheduler, instance = _decoupled()
        streams, futures = _submit_two(scheduler)
        await _turn()
        assert instance.respond(0, lambda: None)
        instance.end(BatchFailure("boom", FailureCause.MODEL))
        await _turn()
        assert instance.batches == []
        for future in futures:
            with pytest.raises(Exception, match="boom"):
                await future

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
        first, second = ResponseStream(), ResponseStream()
        scheduler.submit(_request([[0, 0]]), _value, first)
        await _turn()
        first.cancel()  # its client leaves while its batch runs
        instance.end()
        later = scheduler.submit(_request([[1, 1]]), _value, second)
        await _turn()
        assert instance.respond(0, lambda: None)
        instance.end()
        await _turn()
        assert later.done() and later.result() is None

    run(body)


def test_a_request_whose_response_cannot_be_made_fails_once_and_stops_its_generation():
    """Finishing a response fails for the only request (say, NaN in generate's JSON): it
    ends with that error, counted once, and the batch is cancelled: nobody wants more."""

    async def body():
        scheduler, instance = _decoupled(ORDERED)
        stream = ResponseStream()

        def unencodable(outputs: dict[str, Tensor], parameters: dict) -> list[float]:
            raise ProtocolError("output 'Y' holds NaN")

        future = scheduler.submit(_request([[0, 0]]), unencodable, stream)
        await _turn()
        instance.respond(0, lambda: None)
        assert instance.cancelled == [8]
        instance.end(BatchFailure("it went on and failed", FailureCause.INSTANCE))
        await _turn()
        with pytest.raises(ProtocolError, match="NaN"):
            future.result()
        assert sum(scheduler._statistics.failures.values()) == 1

    run(body)


def test_a_rerun_to_isolate_a_fault_leaves_out_requests_whose_clients_left():
    async def body():
        scheduler, instance = _decoupled()
        streams = [ResponseStream() for _ in range(2)]
        for index, stream in enumerate(streams):
            scheduler.submit(_request([[index, index]]), _value, stream)
        await _turn()
        streams[0].cancel()  # the other client stays: the batch goes on
        instance.end(BatchFailure("boom", FailureCause.MODEL))  # before any response
        await _turn()
        assert [batch.tolist() for batch, _, _ in instance.batches] == [[[1, 1]]]

    run(body)
