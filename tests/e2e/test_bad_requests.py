"""Malformed, oversized and lying requests: each gets a clear 4xx and harms nothing."""

from __future__ import annotations

import struct

import httpx
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.e2e

GOOD = {
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
    ]
}


@pytest.fixture(scope="module")
def http(bundled_server):
    with httpx.Client(base_url=bundled_server.url, timeout=10) as client:
        yield client


def _assert_still_serving(http: httpx.Client) -> None:
    response = http.post("/v2/models/add_sub/infer", json=GOOD)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [i + 1 for i in range(16)]


def _with_input(**changes) -> dict:
    """GOOD with INPUT0 changed; a change to None removes that key."""
    first = {
        key: value for key, value in dict(GOOD["inputs"][0], **changes).items() if value is not None
    }
    return {"inputs": [first, GOOD["inputs"][1]]}


def _binary(header: dict, payload: bytes, header_length: int | None = None) -> tuple[bytes, dict]:
    encoded = msgspec.json.encode(header)
    length = len(encoded) if header_length is None else header_length
    return encoded + payload, {"Inference-Header-Content-Length": str(length)}


def _int32(values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


CASES = {
    "malformed json": (b'{"inputs": [', {}, 400, "model 'add_sub': malformed request JSON"),
    "not an object": (b"[1, 2]", {}, 400, "malformed request JSON"),
    "unknown input": (
        msgspec.json.encode(_with_input(name="FOO")),
        {},
        400,
        "model 'add_sub': unknown input 'FOO' (inputs: INPUT0, INPUT1)",
    ),
    "wrong datatype": (
        msgspec.json.encode(_with_input(datatype="FP32")),
        {},
        400,
        "model 'add_sub': input 'INPUT0': expected datatype INT32, got FP32",
    ),
    "wrong shape": (
        msgspec.json.encode(_with_input(shape=[1, 15], data=list(range(15)))),
        {},
        400,
        "model 'add_sub': input 'INPUT0': expected shape [-1, 16], got [1, 15]",
    ),
    "batch too large": (
        msgspec.json.encode(_with_input(shape=[9, 16], data=[0] * 144)),
        {},
        400,
        "input 'INPUT0': shape [9, 16] needs a batch dimension of 1..8 first",
    ),
    "negative dim": (
        msgspec.json.encode(_with_input(shape=[-1, 16])),
        {},
        400,
        "has a negative dimension",
    ),
    "data shorter than shape": (
        msgspec.json.encode(_with_input(data=[1, 2, 3])),
        {},
        400,
        "model 'add_sub': input 'INPUT0': data has 3 elements, shape [1, 16] needs 16",
    ),
    "strings as INT32": (
        msgspec.json.encode(_with_input(data=["a"] * 16)),
        {},
        400,
        "input 'INPUT0': data holds values that are not INT32",
    ),
    "floats as INT32": (
        msgspec.json.encode(_with_input(data=[0.5] * 16)),
        {},
        400,
        "values that are not INT32",
    ),
    "INT32 out of range": (
        msgspec.json.encode(_with_input(data=[2**40] * 16)),
        {},
        400,
        "out of range for INT32",
    ),
    "missing input": (
        msgspec.json.encode({"inputs": [GOOD["inputs"][0]]}),
        {},
        400,
        "model 'add_sub': missing required input(s): INPUT1",
    ),
    "no data": (
        msgspec.json.encode(_with_input(data=None)),
        {},
        400,
        "input 'INPUT0': has neither data nor binary_data_size",
    ),
    "batch sizes disagree": (
        msgspec.json.encode(
            {"inputs": [_with_input(shape=[2, 16], data=[0] * 32)["inputs"][0], GOOD["inputs"][1]]}
        ),
        {},
        400,
        "inputs disagree on the batch size (INPUT0=2, INPUT1=1)",
    ),
    "unknown output": (
        msgspec.json.encode({**GOOD, "outputs": [{"name": "NOPE"}]}),
        {},
        400,
        "model 'add_sub': unknown output 'NOPE' (outputs: OUTPUT0, OUTPUT1)",
    ),
    "header length beyond body": (
        *_binary(GOOD, b"", header_length=10_000),
        400,
        "Inference-Header-Content-Length 10000 exceeds the",
    ),
    "header length not a number": (
        msgspec.json.encode(GOOD),
        {"Inference-Header-Content-Length": "-3"},
        400,
        "Inference-Header-Content-Length must be a non-negative integer",
    ),
    "binary size beyond body": (
        *_binary(_with_input(data=None, parameters={"binary_data_size": 1 << 40}), _int32([0])),
        400,
        "binary_data_size 1099511627776 exceeds the 4 bytes left in the body",
    ),
    "binary size not matching shape": (
        *_binary(_with_input(data=None, parameters={"binary_data_size": 8}), _int32([1, 2])),
        400,
        "input 'INPUT0': binary data holds 8 bytes, shape [1, 16] of INT32 needs 64",
    ),
    "bytes left over": (
        *_binary(GOOD, b"trailing"),
        400,
        "body has 8 bytes beyond the header",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_infer_request(http, case):
    body, headers, status, message = CASES[case]
    response = http.post("/v2/models/add_sub/infer", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert message in response.json()["error"]
    _assert_still_serving(http)


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/v2/models/nope/infer", 404, "Request for unknown model: 'nope' is not found"),
        (
            "/v2/models/add_sub/versions/7/infer",
            404,
            "Request for unknown model: 'add_sub' version 7 is not found",
        ),
        (
            "/v2/models/add_sub/versions/x/infer",
            404,
            "Request for unknown model: 'add_sub' version x is not found",
        ),
    ],
)
def test_unknown_model_or_version(http, path, status, message):
    response = http.post(path, json=GOOD)
    assert response.status_code == status
    assert response.json() == {"error": message}


def _bytes_header(shape: list[int], size: int) -> dict:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": shape,
                "datatype": "BYTES",
                "parameters": {"binary_data_size": size},
            }
        ]
    }


def test_absurd_shapes_do_not_allocate(http):
    # 10^15 BYTES elements claimed, 8 bytes sent: rejected from the bytes actually present.
    body, headers = _binary(_bytes_header([1, 10**15], 8), struct.pack("<I", 4) + b"abcd")
    response = http.post("/v2/models/identity_bytes/infer", content=body, headers=headers)
    assert response.status_code == 400
    assert "holds fewer than 1000000000000000 elements" in response.json()["error"]
    # The same lie in JSON.
    response = http.post(
        "/v2/models/identity_bytes/infer",
        json={
            "inputs": [{"name": "INPUT0", "shape": [8, 2**62], "datatype": "BYTES", "data": ["x"]}]
        },
    )
    assert response.status_code == 400
    assert "data has 1 elements, shape [8, 4611686018427387904] needs" in response.json()["error"]
    _assert_still_serving(http)


def test_lying_bytes_length_prefix(http):
    payload = struct.pack("<I", 1000) + b"short"
    body, headers = _binary(_bytes_header([1, 1], len(payload)), payload)
    response = http.post("/v2/models/identity_bytes/infer", content=body, headers=headers)
    assert response.status_code == 400
    assert "element 0 claims 1000 bytes, past the end of the data" in response.json()["error"]
    _assert_still_serving(http)


def test_non_utf8_bytes_need_binary_output(http):
    payload = struct.pack("<I", 2) + b"\xff\xfe"
    body, headers = _binary(_bytes_header([1, 1], len(payload)), payload)
    response = http.post("/v2/models/identity_bytes/infer", content=body, headers=headers)
    assert response.status_code == 400
    assert "output 'OUTPUT0' holds non-UTF-8 bytes" in response.json()["error"]
    header = {**_bytes_header([1, 1], len(payload)), "parameters": {"binary_data_output": True}}
    body, headers = _binary(header, payload)
    response = http.post("/v2/models/identity_bytes/infer", content=body, headers=headers)
    assert response.status_code == 200
    json_length = int(response.headers["Inference-Header-Content-Length"])
    assert response.content[json_length:] == payload


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    inputs=st.lists(
        st.fixed_dictionaries(
            {
                "name": st.sampled_from(["INPUT0", "INPUT1", "X"]),
                "shape": st.lists(st.integers(-2, 2**40), max_size=3),
                "datatype": st.sampled_from(["INT32", "FP32", "BYTES", "BOOL", "??"]),
            },
            optional={
                "data": json_values,
                "parameters": st.dictionaries(
                    st.sampled_from(["binary_data_size", "x"]), json_values, max_size=2
                ),
            },
        ),
        max_size=3,
    ),
    tail=st.binary(max_size=64),
    header_length=st.none() | st.integers(0, 400),
)
def test_fuzzed_requests_get_4xx(http, inputs, tail, header_length):
    header = msgspec.json.encode({"inputs": inputs})
    headers = (
        {} if header_length is None else {"Inference-Header-Content-Length": str(header_length)}
    )
    response = http.post("/v2/models/add_sub/infer", content=header + tail, headers=headers)
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["error"]


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/v2/nothing", 404, "no such endpoint: GET /v2/nothing"),
        (
            "GET",
            "/metrics",
            404,
            "no such endpoint: GET /metrics; metrics are served on the metrics port "
            "(--metrics-port, 8002 by default): http://<host>:8002/metrics",
        ),
        ("GET", "/v2/models/add_sub/infer", 405, "GET is not allowed on /v2/models/add_sub/infer"),
        ("DELETE", "/v2/health/live", 405, "DELETE is not allowed on /v2/health/live"),
    ],
)
def test_unrouted_requests_answer_error_json(http, method, path, status, message):
    response = http.request(method, path)
    assert response.status_code == status
    assert response.json() == {"error": message}
