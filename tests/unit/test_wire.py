"""The wire formats: BYTES framing, request decoding and response encoding, fuzzed."""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import reposerve
from reposerve.config import parse_model_config
from reposerve.datatypes import (
    RUN_PROBE,
    byte_runs,
    pack_bytes,
    to_numpy,
    unpack_bytes,
)
from reposerve.errors import ProtocolError
from reposerve.protocol.request import decode_request
from reposerve.protocol.response import encode_response
from reposerve.tensor import Tensor, split_batch

pytestmark = pytest.mark.unit

CONFIG = parse_model_config(
    """
    max_batch_size = 4
    [[input]]
    name = "X"
    datatype = "FP32"
    shape = [2]
    [[input]]
    name = "S"
    datatype = "BYTES"
    shape = [-1]
    optional = true
    [[output]]
    name = "Y"
    datatype = "FP32"
    shape = [2]
    """,
    "m/config.toml",
)


@given(st.lists(st.binary(max_size=40), max_size=20))
def test_bytes_framing_round_trips(items):
    raw = pack_bytes(items)
    assert unpack_bytes(raw, len(items)) == items
    assert byte_runs(raw, len(items)).offset(len(items)) == len(raw)


@given(st.binary(max_size=64), st.integers(0, 10**12))
def test_bytes_framing_never_reads_past_the_end(raw, count):
    try:
        runs = byte_runs(raw, count)
    except ValueError:
        return
    assert runs.offset(count) == len(raw) and len(runs.elements(raw)) == count


def _walked(raw: bytes, count: int) -> list[int] | str:
    """The framing read one element at a time (the oracle): offsets, or what is wrong."""
    offsets, position = [0], 0
    for index in range(count):
        if position + 4 > len(raw):
            return f"holds fewer than {count} elements ({index} found)"
        (length,) = struct.unpack_from("<I", raw, position)
        position += 4 + length
        if position > len(raw):
            return f"element {index} claims {length} bytes, past the end of the data"
        offsets.append(position)
    if position != len(raw):
        return f"has {len(raw) - position} bytes left over after {count} elements"
    return offsets


# Elements in runs of one length, long and short, with a lying tail now and then.
_RUNS = st.lists(st.tuples(st.binary(max_size=5), st.integers(1, 3 * RUN_PROBE)), max_size=6).map(
    lambda runs: [item for item, times in runs for _ in range(times)]
)


@given(_RUNS, st.integers(-2, 2), st.binary(max_size=6))
def test_runs_read_the_framing_as_a_walk_one_element_at_a_time_does(items, extra, tail):
    raw = pack_bytes(items) + tail
    count = max(len(items) + extra, 0)
    expected = _walked(raw, count)
    try:
        runs = byte_runs(raw, count)
    except ValueError as exc:
        assert str(exc) == expected
        return
    assert [runs.offset(index) for index in range(count + 1)] == expected
    assert runs.elements(raw).tolist() == [
        raw[start + 4 : stop] for start, stop in zip(expected, expected[1:], strict=False)
    ]


def _lines_run(work: Callable[[], object]) -> int:
    """Lines of reposerve's own code that ``work`` runs (a hook of another package, as
    hypothesis's on garbage collection, does not count)."""
    package = str(Path(reposerve.__file__).parent)
    lines = 0

    def trace(frame, event, arg):
        nonlocal lines
        if not frame.f_code.co_filename.startswith(package):
            return None
        lines += event == "line"
        return trace

    sys.settrace(trace)
    try:
        work()
    finally:
        sys.settrace(None)
    return lines


@pytest.mark.parametrize("item", [b"", b"token-17"])
def test_a_flood_of_equal_elements_takes_no_python_step_per_element(item):
    """16 Mi empty elements walked in Python held the GIL for seconds: the front's event
    loop (health checks) waited, whichever thread walked. A run of equal elements is
    checked and read back by numpy: the Python lines run do not grow with the count."""
    count = 1 << 18
    raw = pack_bytes([item] * count)
    lines = _lines_run(lambda: byte_runs(raw, count).elements(raw))
    assert lines < 50 * RUN_PROBE  # the first RUN_PROBE elements, then numpy
    assert unpack_bytes(raw, count) == [item] * count
    tensor = Tensor("BYTES", (count, 1), memoryview(raw))
    assert _lines_run(lambda: split_batch(tensor, [count // 2, count // 2])) < 100 * RUN_PROBE


def test_json_bytes_data_is_framed_without_a_python_step_per_element():
    count = 1 << 16
    body = msgspec.json.encode(
        {"inputs": [{"name": "V", "shape": [count, 1], "datatype": "BYTES",
                     "data": [[""]] * count}]}
    )  # fmt: skip
    config = parse_model_config(
        '[[input]]\nname = "V"\ndatatype = "BYTES"\nshape = [-1, 1]\n'
        '[[output]]\nname = "W"\ndatatype = "FP32"\nshape = [1]\n',
        "m/config.toml",
    )
    request = None

    def decode() -> None:
        nonlocal request
        request = decode_request(body, None, config, "m")

    assert _lines_run(decode) < 1000
    assert bytes(request.inputs["V"].raw) == bytes(4 * count)


def _binary_body(header: dict, payload: bytes) -> tuple[bytes, int]:
    encoded = msgspec.json.encode(header)
    return encoded + payload, len(encoded)


def test_binary_input_is_a_view_on_the_body():
    values = np.array([[1.5, -2.0], [3.0, 4.0]], dtype=np.float32)
    body, length = _binary_body(
        {"inputs": [{"name": "X", "shape": [2, 2], "datatype": "FP32",
                     "parameters": {"binary_data_size": values.nbytes}}]},
        values.tobytes(),
    )  # fmt: skip
    request = decode_request(body, length, CONFIG, "m")
    tensor = request.inputs["X"]
    assert isinstance(tensor.raw, memoryview) and tensor.raw.obj is body
    np.testing.assert_array_equal(to_numpy("FP32", tensor.shape, tensor.raw), values)
    assert request.batch_size == 2


@given(
    values=st.lists(
        st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=2, max_size=8
    ).filter(lambda v: len(v) % 2 == 0),
    binary=st.booleans(),
)
def test_response_carries_what_the_model_returned(values, binary):
    array = np.array(values, dtype=np.float32).reshape(-1, 2)
    tensor = Tensor("FP32", array.shape, memoryview(array.tobytes()))
    body, length = encode_response("m", "1", "id-1", [("Y", tensor, binary)])
    header = msgspec.json.decode(body[: length or len(body)])
    assert header["id"] == "id-1" and header["outputs"][0]["shape"] == list(array.shape)
    if binary:
        assert header["outputs"][0]["parameters"] == {"binary_data_size": array.nbytes}
        assert body[length:] == array.tobytes()
    else:
        assert header["outputs"][0]["data"] == array.reshape(-1).tolist()


@given(st.lists(st.lists(st.binary(max_size=6), min_size=1, max_size=3), min_size=1, max_size=4))
def test_split_batch_cuts_bytes_tensors_per_request(requests):
    width = len(requests[0])
    requests = [(items * width)[:width] for items in requests]
    raw = pack_bytes([item for items in requests for item in items])
    tensor = Tensor("BYTES", (len(requests), width), memoryview(raw))
    pieces = split_batch(tensor, [1] * len(requests))
    for piece, items in zip(pieces, requests, strict=True):
        assert piece.shape == (1, width)
        assert unpack_bytes(piece.raw, width) == items


def test_a_batch_of_one_request_is_its_own_piece_without_a_walk():
    """A BYTES output is cut by walking its elements; a batch holding one request needs no
    cut (a walk of millions of elements on the event loop stalls every client)."""
    tensor = Tensor("BYTES", (3, 2_000_000), memoryview(b"not walked"))
    assert split_batch(tensor, [3]) == [tensor]
    assert split_batch(tensor, [3])[0] is tensor


@given(st.binary(max_size=200), st.none() | st.integers(0, 300))
def test_decoder_rejects_garbage_with_protocol_errors_only(body, header_length):
    try:
        decode_request(body, header_length, CONFIG, "m")
    except ProtocolError as exc:
        assert exc.message.startswith("model 'm'")


def test_bytes_lying_length_is_rejected():
    payload = struct.pack("<I", 99) + b"abc"
    body, length = _binary_body(
        {"inputs": [
            {"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]},
            {"name": "S", "shape": [1, 1], "datatype": "BYTES",
             "parameters": {"binary_data_size": len(payload)}},
        ]},
        payload,
    )  # fmt: skip
    with pytest.raises(ProtocolError, match="element 0 claims 99 bytes, past the end"):
        decode_request(body, length, CONFIG, "m")


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_json_refuses_what_it_cannot_carry(value):
    tensor = Tensor("FP32", (1, 2), memoryview(np.array([0, value], np.float32).tobytes()))
    with pytest.raises(ProtocolError, match="output 'Y' holds NaN or infinity"):
        encode_response("m", "1", None, [("Y", tensor, False)])
    body, length = encode_response("m", "1", None, [("Y", tensor, True)])
    assert np.frombuffer(body[length:], np.float32)[1] == value or np.isnan(value)


def _one_input(datatype: str):
    return parse_model_config(
        f'[[input]]\nname = "V"\ndatatype = "{datatype}"\nshape = [1]\n'
        '[[output]]\nname = "W"\ndatatype = "FP32"\nshape = [1]\n',
        "m/config.toml",
    )


@pytest.mark.parametrize(
    ("datatype", "data", "words"),
    [
        ("BOOL", ["true"], "attempt to access JSON non-boolean as boolean"),
        ("INT8", [1.5], "attempt to access JSON non-signed-integer as signed-integer"),
        ("UINT16", [True], "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ("FP64", ["1"], "attempt to access JSON non-number as double"),
        ("BYTES", [1], "attempt to access JSON non-string as string"),
    ],
)
def test_json_data_of_the_wrong_kind_is_refused_in_tritons_words(datatype, data, words):
    body = msgspec.json.encode(
        {"inputs": [{"name": "V", "shape": [1], "datatype": datatype, "data": data}]}
    )
    with pytest.raises(ProtocolError) as raised:
        decode_request(body, None, _one_input(datatype), "m")
    assert "input 'V'" in str(raised.value) and f"({words})" in str(raised.value)


def test_an_input_given_twice_is_refused_in_tritons_words():
    body = msgspec.json.encode(
        {"inputs": [{"name": "V", "shape": [1], "datatype": "FP32", "data": [1]}] * 2}
    )
    with pytest.raises(ProtocolError, match="input 'V' already exists in request"):
        decode_request(body, None, _one_input("FP32"), "m")
