"""The server object and the fronts attached to it: gRPC (and metrics) without HTTP
(Triton's --allow-http false), and a server with no inference front at all refused."""

from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.server import REPO_ROOT, running_server
from tests.toy_models import PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e


def test_grpc_and_metrics_serve_without_http(repository, tmp_path):
    write_model(repository, "plus_one", vector_config(), PLUS_ONE)
    with running_server(repository, tmp_path, "--allow-http", "false") as server:
        with grpcclient.InferenceServerClient(server.grpc_address) as client:
            assert client.is_server_ready()
            data = np.arange(16, dtype=np.float32).reshape(1, 16)
            request = grpcclient.InferInput("INPUT", [1, 16], "FP32")
            request.set_data_from_numpy(data)
            result = client.infer("plus_one", [request])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT"), data + 1)
        with pytest.raises(httpx.ConnectError):  # nothing listens on the HTTP port
            httpx.get(f"{server.url}/v2/health/live", timeout=5)
        metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5)
        assert 'nv_inference_request_success{model="plus_one",version="1"} 1' in metrics.text
    log = server.log()
    assert f"ready: serving {repository} on grpc://127.0.0.1:{server.grpc_port}" in log
    assert "stopped: every model unloaded" in log


def test_a_failed_start_up_ends_a_server_without_http(repository, tmp_path):
    write_model(repository, "broken", vector_config(), "this is not python")
    result = subprocess.run(
        [sys.executable, "-m", "reposerve", "--model-repository", str(repository),
         "--allow-http", "false", "--grpc-port", "0", "--allow-metrics", "false"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "exiting: broken failed to load" in result.stderr


def test_no_inference_front_is_refused(repository):
    result = subprocess.run(
        [sys.executable, "-m", "reposerve", "--model-repository", str(repository),
         "--allow-http", "false", "--allow-grpc", "false"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--allow-http and --allow-grpc are both false" in result.stderr
