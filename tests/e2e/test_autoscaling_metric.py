"""The autoscaler's metric, for real: Prometheus scrapes two reposerve replicas (one busy,
one idle) as the ServiceMonitor has it scrape pods, and the prometheus-adapter rule in
deploy/k8s/prometheus-adapter/values.yaml is run as the adapter runs it (its series query,
its name mapping, its metrics query with the pods' label matchers). The busy pod reads the
queue time per request that reposerve's own statistics give; the idle one reads 0, not
"no data", so the HorizontalPodAutoscaler can scale down."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.manifests import DEPLOY
from tests.server import REPO_ROOT, Server, free_port, start_server
from tests.toy_models import vector_config, write_model

pytestmark = pytest.mark.e2e

# Debian's package unpacked by tools/install_deploy_tools.sh, or one on PATH
UNPACKED = REPO_ROOT / ".tools" / "deploy" / "prometheus" / "usr" / "bin" / "prometheus"
PROMETHEUS = str(UNPACKED) if UNPACKED.exists() else shutil.which("prometheus")
NAMESPACE = "serving"
PODS = ("reposerve-busy", "reposerve-idle")
CLIENTS = 4
LOAD_SECONDS = 3.0

# One instance, no batching, 30 ms a request: concurrent requests wait in the queue.
QUEUEING = """
    import time

    class Model:
        def execute(self, inputs):
            time.sleep(0.03)
            return {"OUTPUT": inputs["INPUT"] + 1}
"""


def _rule() -> dict:
    (rule,) = yaml.safe_load((DEPLOY / "k8s/prometheus-adapter/values.yaml").read_text())["rules"][
        "custom"
    ]
    return rule


def _expand(template: str, **values: str) -> str:
    """The adapter's Go template, for the fields its rules use."""
    for field, value in values.items():
        template = template.replace(f"<<.{field}>>", value)
    assert "<<" not in template, template
    return template


class _Prometheus:
    def __init__(self, targets: dict[str, Server], folder: Path) -> None:
        scrape = {
            "job_name": "reposerve",
            "scrape_interval": "1s",
            "static_configs": [
                # the labels the Prometheus Operator puts on a pod's series
                {
                    "targets": [f"127.0.0.1:{server.metrics_port}"],
                    "labels": {"namespace": NAMESPACE, "pod": pod},
                }
                for pod, server in targets.items()
            ],
        }
        config = folder / "prometheus.yml"
        config.write_text(yaml.safe_dump({"scrape_configs": [scrape]}))
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = (folder / "prometheus.log").open("w")
        self._process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params: str) -> list[dict]:
        reply = httpx.get(f"{self.url}{path}", params=params, timeout=10).json()
        assert reply["status"] == "success", reply
        return reply["data"]["result"] if path.endswith("query") else reply["data"]

    def query(self, expression: str) -> dict[str, float]:
        return {
            sample["metric"].get("pod", ""): float(sample["value"][1])
            for sample in self.get("/api/v1/query", query=expression)
        }

    def wait(self, expression: str, predicate, timeout: float = 30.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        found: dict[str, float] | None = None
        while found is None or not predicate(found):
            assert time.monotonic() < deadline, f"{expression}: {found}"
            time.sleep(0.2)
            try:
                found = self.query(expression)
            except httpx.TransportError:  # not listening yet
                continue
        return found

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)
        self._log.close()


@pytest.fixture
def replicas(repository: Path, tmp_path: Path) -> Iterator[dict[str, Server]]:
    write_model(repository, "queueing", vector_config(max_batch=0), QUEUEING)
    servers = {pod: start_server(repository, tmp_path) for pod in PODS}
    yield servers
    for server in servers.values():
        assert server.stop() == 0, server.log()


def _load(server: Server, until: float) -> None:
    body = {"inputs": [{"name": "INPUT", "shape": [16], "datatype": "FP32", "data": [1.0] * 16}]}
    with httpx.Client(base_url=f"http://{server.address}", timeout=30) as client:
        while time.monotonic() < until:
            reply = client.post("/v2/models/queueing/infer", json=body)
            assert reply.status_code == 200, reply.text


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus is not installed: "
    "run tools/install_deploy_tools.sh (it unpacks Debian's prometheus package)",
)
def test_the_adapter_rule_reads_queue_time_per_request_per_pod(replicas, tmp_path):
    prometheus = _Prometheus(replicas, tmp_path)
    try:
        rule = _rule()
        success = 'nv_inference_request_success{pod="%s"}'
        # a first scrape at zero, so that the rule's window sees every request
        prometheus.wait(success % PODS[0], lambda found: found == {PODS[0]: 0.0})
        until = time.monotonic() + LOAD_SECONDS
        clients = [
            threading.Thread(target=_load, args=(replicas[PODS[0]], until)) for _ in range(CLIENTS)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        stats = httpx.get(f"http://{replicas[PODS[0]].address}/v2/models/queueing/stats").json()
        inference = stats["model_stats"][0]["inference_stats"]
        answered = inference["success"]["count"]
        # every answer scraped
        prometheus.wait(success % PODS[0], lambda found: found.get(PODS[0]) == answered)

        # the adapter discovers the series by the rule's series query and renames them
        series = prometheus.get("/api/v1/series", **{"match[]": rule["seriesQuery"]})
        assert {entry["pod"] for entry in series} == set(PODS)
        assert all(entry["namespace"] == NAMESPACE for entry in series)
        assert all(re.search(rule["name"]["matches"], entry["__name__"]) for entry in series)

        per_pod = prometheus.query(
            _expand(
                rule["metricsQuery"],
                LabelMatchers=f'namespace="{NAMESPACE}",pod=~"{"|".join(PODS)}"',
                GroupBy="pod",
            )
        )
        expected = (inference["queue"]["ns"] // 1000) / answered
        assert answered >= CLIENTS and expected > 10_000  # queued 10 ms or more on average
        assert per_pod[PODS[0]] == pytest.approx(expected, rel=1e-6)
        assert per_pod[PODS[1]] == 0.0
    finally:
        prometheus.stop()
