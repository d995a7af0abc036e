"""The autoscaler's metric, for real: Prometheus scrapes two reposerve replicas (one busy,
one idle) as the ServiceMonitor has it scrape pods, and the prometheus-adapter rule in
deploy/k8s/prometheus-adapter/values.yaml is run as the adapter runs it (its series query,
its name mapping, its metrics query with the pods' label matchers). The busy pod reads the
queue time per request that reposerve's own statistics give; the idle one reads 0, not
"no data", so the HorizontalPodAutoscaler can scale down."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.autoscaling import (
    NAMESPACE,
    QUEUEING,
    QUEUEING_MODEL,
    Load,
    Prometheus,
    needs_prometheus,
)
from tests.manifests import DEPLOY
from tests.server import Server, start_server
from tests.toy_models import vector_config, write_model

pytestmark = pytest.mark.e2e

PODS = ("reposerve-busy", "reposerve-idle")
CLIENTS = 4
ANSWERS = 100  # under load: each request waits for the CLIENTS - 1 before it


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


@pytest.fixture
def replicas(repository: Path, tmp_path: Path) -> Iterator[dict[str, Server]]:
    write_model(repository, QUEUEING_MODEL, vector_config(max_batch=0), QUEUEING)
    servers = {pod: start_server(repository, tmp_path) for pod in PODS}
    yield servers
    for server in servers.values():
        assert server.stop() == 0, server.log()


@needs_prometheus
def test_the_adapter_rule_reads_queue_time_per_request_per_pod(replicas, tmp_path):
    prometheus = Prometheus(replicas, tmp_path)
    try:
        rule = _rule()
        success = 'nv_inference_request_success{pod="%s"}'
        # a first scrape at zero, so that the rule's window sees every request
        prometheus.wait(success % PODS[0], lambda found: found == {PODS[0]: 0.0})
        load = Load(replicas[PODS[0]], CLIENTS)
        load.wait_answered(ANSWERS)
        load.stop()
        stats = httpx.get(f"{replicas[PODS[0]].url}/v2/models/{QUEUEING_MODEL}/stats").json()
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
