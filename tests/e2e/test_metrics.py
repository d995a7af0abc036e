"""Prometheus metrics on --metrics-port, in Triton's names, matching the statistics: failure
reasons, latency summaries, CPU/GPU gauges, and the Grafana dashboard that reads them."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reposerve.metrics import render
from reposerve.utilization import GpuUsage, Usage, open_gpu_reader
from tests.server import REPO_ROOT, running_server, start_server
from tests.toy_models import ERROR, PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e

BODY = {"inputs": [{"name": "INPUT", "shape": [2, 1], "datatype": "FP32", "data": [1, 2]}]}
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "reposerve-dashboard.json"

# Holds each request 0.3 s: with one instance, batches of one and a queue of one, a burst
# of eight runs one, queues one and has the rest refused.
SLOW = """
    import time

    class Model:
        def execute(self, inputs):
            time.sleep(0.3)
            return {"OUTPUT": inputs["INPUT"]}
"""


class Exposition:
    """A parsed scrape: ``value(name, **labels)`` finds the one sample with those labels."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(self, name: str, **labels: str) -> float:
        family = self.families.get(name) or self.families[re.sub(r"_(count|sum)$", "", name)]
        wanted = {name, f"{name}_total"}  # the parser adds _total to counter samples
        found = [
            s.value
            for s in family.samples
            if s.name in wanted and labels.items() <= s.labels.items()
        ]
        assert len(found) == 1, (name, labels, family.samples)
        return found[0]


def _scrape(port: int) -> Exposition:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Exposition(response.text)


def test_metrics_follow_the_statistics(repository, tmp_path):
    write_model(repository, "plus", vector_config(size=1), PLUS_ONE)
    server = start_server(repository, tmp_path)
    metrics = f"http://127.0.0.1:{server.metrics_port}"
    try:
        for _ in range(3):
            assert httpx.post(f"{server.url}/v2/models/plus/infer", json=BODY).status_code == 200
        bad = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": ["x"]}]}
        assert httpx.post(f"{server.url}/v2/models/plus/infer", json=bad).status_code == 400
        scrape = _scrape(server.metrics_port)
        assert scrape.families["nv_inference_count"].type == "counter"
        stats = httpx.get(f"{server.url}/v2/models/plus/stats").json()["model_stats"][0]
        key = {"model": "plus", "version": "1"}
        assert scrape.value("nv_inference_request_success", **key) == 3
        assert scrape.value("nv_inference_count", **key) == 6 == stats["inference_count"]
        assert scrape.value("nv_inference_exec_count", **key) == stats["execution_count"]
        assert scrape.value("nv_inference_pending_request_count", **key) == 0
        infer_us = stats["inference_stats"]["compute_infer"]["ns"] // 1000
        assert scrape.value("nv_inference_compute_infer_duration_us", **key) == infer_us
        assert not any(name.endswith("_summary_us") for name in scrape.families)  # Triton: off
        assert httpx.get(f"{metrics}/other").status_code == 404
    finally:
        assert server.stop() == 0, server.log()


def test_failures_by_reason_and_latency_summaries(repository, tmp_path):
    write_model(repository, "error", vector_config(size=1), ERROR)
    queue = "[dynamic_batching]\nmax_queue_size = 1"
    write_model(repository, "slow", vector_config(size=1, max_batch=1, extra=queue), SLOW)
    server = start_server(
        repository, tmp_path,
        "--metrics-config", "summary_latencies=true",
        "--metrics-config", "summary_quantiles=0.5:0.05,0.99:0.001",
    )  # fmt: skip

    async def burst() -> list[int]:
        one = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            responses = await asyncio.gather(
                *(http.post("/v2/models/slow/infer", json=one) for _ in range(8))
            )
        return [response.status_code for response in responses]

    try:
        before = _scrape(server.metrics_port)
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            labels = {"model": "error", "version": "1", "reason": reason}
            assert before.value("nv_inference_request_failure", **labels) == 0
        negative = {
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [-1]}]
        }
        assert httpx.post(f"{server.url}/v2/models/error/infer", json=negative).status_code == 500
        assert httpx.post(f"{server.url}/v2/models/error/infer", json=BODY).status_code == 200
        statuses = asyncio.run(burst())
        assert statuses.count(503) >= 1 and statuses.count(200) >= 1, statuses
        scrape = _scrape(server.metrics_port)

        def failures(model: str) -> dict[str, float]:
            return {
                reason: scrape.value(
                    "nv_inference_request_failure", model=model, version="1", reason=reason
                )
                for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
            }

        assert failures("error") == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
        assert failures("slow") == {
            "REJECTED": statuses.count(503), "CANCELED": 0, "BACKEND": 0, "OTHER": 0
        }  # fmt: skip

        slow = {"model": "slow", "version": "1"}
        served = statuses.count(200)
        assert scrape.value("nv_inference_request_summary_us_count", **slow) == served
        total_us = scrape.value("nv_inference_request_summary_us_sum", **slow)
        assert total_us == pytest.approx(
            scrape.value("nv_inference_request_duration_us", **slow), abs=served
        )  # the counter sums the same requests (no failure of this model ran)
        median = scrape.value("nv_inference_request_summary_us", quantile="0.5", **slow)
        p99 = scrape.value("nv_inference_request_summary_us", quantile="0.99", **slow)
        assert 300_000 * 0.99 <= median <= p99 <= total_us * 1.01  # each slept 0.3 s
        infer_p99 = scrape.value("nv_inference_compute_infer_summary_us", quantile="0.99", **slow)
        assert 300_000 * 0.99 <= infer_p99 < 2_000_000
        assert scrape.value("nv_inference_queue_summary_us_count", **slow) == served
        plus = scrape.value("nv_inference_compute_input_summary_us", quantile="0.5", model="error")
        assert not math.isnan(plus)  # one request of "error" succeeded
    finally:
        assert server.stop() == 0, server.log()


def test_cpu_gauges_are_sampled(repository, tmp_path):
    write_model(repository, "plus", vector_config(size=1), PLUS_ONE)
    with running_server(repository, tmp_path, "--metrics-interval-ms", "100") as server:
        meminfo = Path("/proc/meminfo").read_text().split("\n", 1)[0]  # MemTotal: N kB
        deadline = time.monotonic() + 10
        while True:
            scrape = _scrape(server.metrics_port)
            utilization = scrape.value("nv_cpu_utilization")
            if utilization > 0 or time.monotonic() > deadline:
                break  # the first sample is 0; later ones see this test's own work
            time.sleep(0.1)
        assert 0 < utilization <= 1
        total = scrape.value("nv_cpu_memory_total_bytes")
        assert total == int(meminfo.split()[1]) * 1024
        assert 0 < scrape.value("nv_cpu_memory_used_bytes") < total


def test_metrics_address_and_cpu_metrics_off(repository, tmp_path):
    write_model(repository, "plus", vector_config(size=1), PLUS_ONE)
    with running_server(
        repository, tmp_path, "--metrics-address", "127.0.0.2", "--allow-cpu-metrics", "false"
    ) as server:
        with pytest.raises(httpx.ConnectError):  # not on --http-host's 127.0.0.1
            httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics")
        response = httpx.get(f"http://127.0.0.2:{server.metrics_port}/metrics")
        families = Exposition(response.text).families
        assert "nv_inference_count" in families
        assert not any(name.startswith("nv_cpu_") for name in families)


def test_gpu_gauges_per_gpu(repository, tmp_path):
    reader = open_gpu_reader()
    if reader is None:
        pytest.skip("no GPU metrics here: NVML (nvidia-ml-py and a driver) or a GPU is missing")
    uuids = {gpu.uuid for gpu in reader.read()}
    reader.close()
    write_model(repository, "plus", vector_config(size=1), PLUS_ONE)
    with running_server(repository, tmp_path, "--metrics-interval-ms", "100") as server:
        time.sleep(0.5)
        scrape = _scrape(server.metrics_port)
        for uuid in uuids:
            total = scrape.value("nv_gpu_memory_total_bytes", gpu_uuid=uuid)
            assert 0 < scrape.value("nv_gpu_memory_used_bytes", gpu_uuid=uuid) <= total
            assert 0 <= scrape.value("nv_gpu_utilization", gpu_uuid=uuid) <= 1


def _query_names(dashboard: dict) -> set[str]:
    """Metric names in every panel query (label names, functions and $variables aside)."""
    names = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expression = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", target["expr"])
            for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expression):
                if word.startswith(("nv_", "reposerve_")):
                    names.add(word)
    return names


def test_the_grafana_dashboard_reads_only_names_reposerve_exports(repository, tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    wanted = _query_names(dashboard)
    assert {"nv_inference_request_failure", "nv_inference_request_summary_us"} <= wanted
    assert {"nv_cpu_utilization", "nv_gpu_utilization", "nv_gpu_power_usage"} <= wanted
    write_model(repository, "plus", vector_config(size=1), PLUS_ONE)
    with running_server(
        repository, tmp_path, "--metrics-config", "summary_latencies=true"
    ) as server:
        response = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics")
        exported = {
            sample.name.removesuffix("_total")
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
        }
    if not any(name.startswith("nv_gpu_") for name in exported):
        # No GPU here: the GPU gauges come from the same renderer, fed one GPU's sample.
        gpu = GpuUsage("GPU-0", 0.5, 1, 1, power_w=1.0, power_limit_w=2.0, energy_j=3.0)
        text = render([], usage=Usage(gpus=(gpu,))).decode()
        exported |= {
            sample.name
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
    assert wanted - exported == set()
