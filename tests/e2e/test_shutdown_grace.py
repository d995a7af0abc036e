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
        repository, tmp_path, "--shutdown-grace-secs", "5", "--http-server", http_server
    )
    server.process.send_signal(signal.SIGTERM)
    ready = _until_not_ready(server)
    assert (ready.status_code, ready.json()) == (503, {"ready": False})
    for _ in range(3):  # still served during the grace
        reply = httpx.post(f"{server.url}/v2/models/plus_one/infer", json=BODY)
        assert reply.status_code == 200, reply.text
    assert server.process.wait(30) == 0
    log = server.log()
    assert "leaving: not ready, serving for 5 s more" in log
    # The models stop after the grace, not with the signal.
    assert log.index("leaving: not ready") < log.index("stopping: requests may finish")
    assert server.stop() == 0


def _until_not_ready(server) -> httpx.Response:
    """The first not-ready answer after SIGTERM (the signal takes its own time)."""
    deadline = time.monotonic() + 20
    while True:
        ready = httpx.get(f"{server.url}/v2/health/ready")
        if ready.status_code != 200 or time.monotonic() > deadline:
            return ready
        time.sleep(0.02)


def test_a_second_signal_ends_the_grace_at_once(repository, tmp_path):
    write_model(repository, "plus_one", vector_config(), PLUS_ONE)
    server = start_server(repository, tmp_path, "--shutdown-grace-secs", "3600")
    server.process.send_signal(signal.SIGTERM)
    assert _until_not_ready(server).status_code == 503
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0  # not the hour's grace: the second signal ended it
    assert server.stop() == 0
