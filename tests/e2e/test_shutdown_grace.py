"""SIGTERM under a load balancer: the replica reports not ready at once, keeps serving for
--shutdown-grace-secs, then drains and exits 0; a second signal skips the rest."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.server import start_server
from tests.toy_models import PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e

BODY = {"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16}]}


@pytest.mark.parametrize("http_server", ["uvicorn", "hypercorn"])
def test_a_replica_leaves_not_ready_but_serving_then_exits_0(repository, tmp_path, http_server):
    write_model(repository, "plus_one", vector_config(), PLUS_ONE)
    server = start_server(
        repository, tmp_path, "--shutdown-grace-secs", "2", "--http-server", http_server
    )
    server.process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    time.sleep(0.3)
    ready = httpx.get(f"{server.url}/v2/health/ready")
    assert (ready.status_code, ready.json()) == (503, {"ready": False})
    answered = 0
    while time.monotonic() - sent < 1.5:
        reply = httpx.post(f"{server.url}/v2/models/plus_one/infer", json=BODY)
        assert reply.status_code == 200, reply.text
        answered += 1
    assert answered > 5
    assert server.process.wait(20) == 0
    assert time.monotonic() - sent >= 2.0
    assert server.stop() == 0


def test_a_second_signal_ends_the_grace_at_once(repository, tmp_path):
    write_model(repository, "plus_one", vector_config(), PLUS_ONE)
    server = start_server(repository, tmp_path, "--shutdown-grace-secs", "30")
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 503
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(20) == 0
    assert time.monotonic() - sent < 10
    assert server.stop() == 0
