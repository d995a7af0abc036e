"""The benchmark's load generator against a real server: it counts what it sends.

No speed is asserted here; speed lives in ``python -m tools.bench``.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from reposerve.tune.client import ServerClient, requests_for
from reposerve.tune.load import closed_loop, encode_request, open_loop
from tools.bench.scenarios import _binary_payloads, _json_payloads

pytestmark = pytest.mark.e2e


def test_closed_loop_counts_answers_and_errors(bundled_server):
    host, port = "127.0.0.1", bundled_server.port
    good = _json_payloads("identity_bytes", 16)  # wrong datatype for this model: 400s
    result = asyncio.run(closed_loop("bad", host, port, good, 2, 0.3, warmup=0.0))
    assert result.completed == 0 and result.errors > 0
    binary = _binary_payloads("add_sub", 16)  # FP32 into an INT32 model: also refused
    result = asyncio.run(closed_loop("bad", host, port, binary, 2, 0.3, warmup=0.0))
    assert result.completed == 0 and result.errors > 0


def test_open_loop_sends_at_its_rate(bundled_server):
    body = msgspec.json.encode(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [2] * 16},
            ]
        }
    )
    payload = encode_request("127.0.0.1", "/v2/models/add_sub/infer", body)
    result = asyncio.run(open_loop("ok", "127.0.0.1", bundled_server.port, [payload], 50, 1.0))
    assert result.completed == 50 and result.errors == 0
    assert [s.sent for s in result.samples] == sorted(s.sent for s in result.samples)
    closed = asyncio.run(
        closed_loop("ok", "127.0.0.1", bundled_server.port, [payload], 4, 0.5, warmup=0.1)
    )
    assert closed.completed > 0 and closed.errors == 0
    assert closed.p50_ms <= closed.p99_ms <= closed.max_ms


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize(
    ("model", "shapes"), [("add_sub", None), ("identity_bytes", {"INPUT0": [3]})]
)
def test_workload_from_metadata_is_accepted(bundled_server, model, shapes, binary):
    client = ServerClient(bundled_server.address)
    samples = requests_for(client, model, batch=2, binary=binary, shapes=shapes, count=4)
    requests = [sample.payload("127.0.0.1", model) for sample in samples]
    result = asyncio.run(
        closed_loop("w", "127.0.0.1", bundled_server.port, requests, 2, 0.3, warmup=0.0)
    )
    assert result.completed > 0 and result.errors == 0
