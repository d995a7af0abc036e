"""Triton's perf_analyzer measures against us unchanged (JSON and binary tensors, and
tensors in client shared memory)."""

from __future__ import annotations

import re
import shutil
import subprocess

import httpx
import pytest

from tests.perf_tools import why_perf_analyzer_cannot_run
from tests.server import REPO_ROOT, start_server
from tools.bench.protocols import PERF_ANALYZER, perf_analyzer_environment

pytestmark = [pytest.mark.e2e, pytest.mark.tool]


def _perf_analyzer(model: str, address: str, *flags: str) -> subprocess.CompletedProcess:
    """perf_analyzer at concurrency 4 (skipping the test when it cannot run here). CI
    machines are shared and noisy: completing without errors is the point, not stability."""
    reason = why_perf_analyzer_cannot_run()
    if reason:
        pytest.skip(reason)
    result = subprocess.run(
        [
            str(PERF_ANALYZER), "-m", model, "-u", address, *flags,
            "--concurrency-range", "4", "--measurement-interval", "1000",
            "--stability-percentage", "100", "--max-trials", "20",
        ],
        capture_output=True, text=True, env=perf_analyzer_environment(), timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error" not in result.stdout.lower()
    return result


@pytest.mark.parametrize("tensor_format", ["binary", "json"])
def test_perf_analyzer_completes(bundled_server, tensor_format):
    result = _perf_analyzer(
        "add_sub", bundled_server.address, "-i", "http",
        f"--input-tensor-format={tensor_format}", f"--output-tensor-format={tensor_format}",
    )  # fmt: skip
    assert "Concurrency: 4, throughput:" in result.stdout


def test_perf_analyzer_over_grpc(bundled_server):
    result = _perf_analyzer("add_sub", bundled_server.grpc_address, "-i", "grpc")
    assert "Concurrency: 4, throughput:" in result.stdout


def test_perf_analyzer_streams_a_decoupled_model(bundled_server, tmp_path):
    """--streaming over gRPC on text_stream: perf_analyzer reads the decoupled policy from
    the config, and counts a request complete at its final response (five words: five
    responses per request)."""
    data = tmp_path / "input.json"
    data.write_text('{"data": [{"text_input": ["one two three four five"], "delay_ms": [2]}]}')
    result = _perf_analyzer(
        "text_stream", bundled_server.grpc_address, "-i", "grpc",
        "--streaming", "--async", "--input-data", str(data),
    )  # fmt: skip
    assert "Detected decoupled model" in result.stdout
    requests = float(re.search(r"\n    Throughput: ([\d.]+)", result.stdout)[1])
    responses = float(re.search(r"Response Throughput: ([\d.]+)", result.stdout)[1])
    assert responses / requests == pytest.approx(5, rel=0.05)


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory):
    """add_sub on a server that lets clients register shared memory."""
    root = tmp_path_factory.mktemp("repository")
    shutil.copytree(REPO_ROOT / "model_repository" / "add_sub", root / "add_sub")
    server = start_server(root, tmp_path_factory.mktemp("log"), "--allow-client-shm", "true")
    yield server
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_tensors_in_system_shared_memory(shm_server, protocol):
    """perf_analyzer's C++ clients read any output ``parameters`` over HTTP as binary data
    (``binary_data_size``), so an output written into a region must carry none, as
    Triton's own answer does; every request must come back."""
    address = shm_server.address if protocol == "http" else shm_server.grpc_address
    result = _perf_analyzer(
        "add_sub", address, "-i", protocol,
        "--shared-memory", "system", "--output-shared-memory-size", "64",
    )  # fmt: skip
    found = re.search(r"Concurrency: 4, throughput: ([\d.]+) infer/sec", result.stdout)
    assert found, result.stdout
    assert float(found[1]) > 0
    # Every request perf_analyzer sent was answered, none with an error.
    stats = httpx.get(f"{shm_server.url}/v2/models/add_sub/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert stats["inference_stats"]["success"]["count"] == stats["inference_count"] > 0
