"""Prometheus metrics on --metrics-port, in Triton's names, matching the statistics."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server import start_server
from tests.toy_models import PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e

BODY = {"inputs": [{"name": "INPUT", "shape": [2, 1], "datatype": "FP32", "data": [1, 2]}]}


def _samples(text: str) -> dict[tuple[str, str, str], float]:
    """(family, model, version) -> value; the parser itself adds _total to counter samples."""
    return {
        (family.name, sample.labels["model"], sample.labels["version"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_follow_the_statistics(repository, tmp_path):
    write_model(repository, "plus", vector_config(size=1), PLUS_ONE)
    server = start_server(repository, tmp_path)
    metrics = f"http://127.0.0.1:{server.metrics_port}"
    try:
        for _ in range(3):
            assert httpx.post(f"{server.url}/v2/models/plus/infer", json=BODY).status_code == 200
        bad = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": ["x"]}]}
        assert httpx.post(f"{server.url}/v2/models/plus/infer", json=bad).status_code == 400
        response = httpx.get(f"{metrics}/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "# TYPE nv_inference_count counter" in response.text
        samples = _samples(response.text)
        stats = httpx.get(f"{server.url}/v2/models/plus/stats").json()["model_stats"][0]
        key = ("plus", "1")
        assert samples[("nv_inference_request_success", *key)] == 3
        assert samples[("nv_inference_count", *key)] == 6 == stats["inference_count"]
        assert samples[("nv_inference_exec_count", *key)] == stats["execution_count"]
        assert samples[("nv_inference_pending_request_count", *key)] == 0
        infer_us = stats["inference_stats"]["compute_infer"]["ns"] // 1000
        assert samples[("nv_inference_compute_infer_duration_us", *key)] == infer_us
        assert httpx.get(f"{metrics}/other").status_code == 404
    finally:
        assert server.stop() == 0, server.log()


def test_metrics_can_be_turned_off(repository, tmp_path):
    write_model(repository, "plus", vector_config(size=1), PLUS_ONE)
    server = start_server(repository, tmp_path, "--allow-metrics", "false")
    try:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    finally:
        assert server.stop() == 0, server.log()
