"""Scaling from zero relies on readiness: the interceptor (or a Service) sends the first
request to a new replica as soon as /v2/health/ready answers 200, so that must mean every
model loaded and warmed. A replica whose model is still loading is live but not ready; once
ready, the first request is answered by an instance that has already run its warmup."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server import Server
from tests.toy_models import vector_body, vector_config, write_model
from tools.cold_start import ColdStart, main

pytestmark = pytest.mark.e2e

# load() waits for the test to open a gate; each answer says how many batches the instance
# ran before it, warmup batches included.
GATED = """
    import os
    import time

    import numpy as np

    GATE = {gate!r}

    class Model:
        def load(self, context):
            while not os.path.exists(GATE):
                time.sleep(0.01)
            self.batches = 0

        def execute(self, inputs):
            before, self.batches = self.batches, self.batches + 1
            return {{"OUTPUT": np.full_like(inputs["INPUT"], before)}}
"""
WARMUP = '[[warmup]]\nbatch_size = 1\ninputs = { INPUT = "random" }'


def _wait(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _status(server: Server, path: str) -> int | None:
    try:
        return httpx.get(f"{server.url}{path}", timeout=5).status_code
    except httpx.TransportError:  # not listening yet
        return None


def test_ready_only_once_loaded_and_warmed_and_the_first_request_is_answered(
    repository: Path, tmp_path: Path
):
    gate = tmp_path / "gate"
    write_model(
        repository, "gated", vector_config(size=4, extra=WARMUP), GATED.format(gate=str(gate))
    )
    server = Server(repository, log_path=tmp_path / "reposerve.log")
    try:
        _wait(lambda: _status(server, "/v2/health/live") == 200, "never live")
        index = httpx.post(f"{server.url}/v2/repository/index", json={}).json()
        assert [(entry["name"], entry["state"]) for entry in index] == [("gated", "LOADING")]
        assert _status(server, "/v2/health/ready") == 503  # live, loading: no traffic yet
        assert _status(server, "/v2/models/gated/ready") != 200

        gate.touch()
        _wait(lambda: _status(server, "/v2/health/ready") == 200, "never ready")
        first = httpx.post(f"{server.url}/v2/models/gated/infer", json=vector_body(1.0), timeout=30)
        assert first.status_code == 200, first.text
        (output,) = first.json()["outputs"]
        # the instance had run its warmup batch before the server said ready
        assert np.all(np.asarray(output["data"]) == 1)
    finally:
        assert server.stop() == 0, server.log()


def test_the_cold_start_tool_times_a_start_to_the_first_answer(repository: Path, capsys):
    """As docs/autoscaling.md runs it, with reposerve's own flags after --."""
    write_model(repository, "gated", vector_config(size=4, extra=WARMUP), GATED.format(gate="/"))
    flags = ["--", "--model-control-mode", "explicit", "--load-model", "gated"]
    assert (
        main(["--model", "gated", "--model-repository", str(repository), "--runs", "1", *flags])
        == 0
    )
    header, run, median = capsys.readouterr().out.splitlines()
    assert header.split() == ["run", *ColdStart.__struct_fields__]
    live, ready, first_answer, first_request, second_request = map(float, run.split()[1:])
    assert 0 < live <= ready < first_answer and first_request > 0 and second_request > 0
    assert median.split()[1:] == run.split()[1:]  # one run: its own median
