"""KEDA's queue metric, for real: Prometheus scrapes a reposerve replica as the Prometheus
Operator has it scrape pods, and the query of deploy/keda's ScaledObject (and of the KEDA
InferenceService in deploy/kserve) runs as KEDA's prometheus scaler runs it: one instant
query, one sample. Under load it rises above the trigger's threshold (KEDA asks for more
replicas); idle, it falls to the activation threshold or below (the trigger goes inactive,
and with the interceptor idle too, KEDA scales to zero)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.autoscaling import (
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

# A pod of the Deployment KServe makes for the InferenceService reposerve-keda; the
# ScaledObject's query selects by namespace and job, which the scrape gives every pod.
POD = "reposerve-keda-predictor-7d4b9c6f8-x2k9q"
# Each request waits for the ones before it on the one instance: about CLIENTS - 1 wait.
CLIENTS = 16


def _scaled_object_trigger() -> dict[str, str]:
    scaled_object = yaml.safe_load((DEPLOY / "keda" / "scaled-object.yaml").read_text())
    (trigger,) = [t for t in scaled_object["spec"]["triggers"] if t["type"] == "prometheus"]
    return trigger["metadata"]


def _inference_service_metric() -> dict[str, Any]:
    service = yaml.safe_load((DEPLOY / "kserve" / "inferenceservice-keda.yaml").read_text())
    (metric,) = service["spec"]["predictor"]["autoScaling"]["metrics"]
    return metric["external"]


def _as_keda_reads(prometheus: Prometheus, query: str) -> float:
    """KEDA's prometheus scaler: an empty result is 0 (ignoreNullValues), more than one
    sample an error."""
    samples = prometheus.query(query)
    assert len(samples) <= 1, f"{query}: {samples}"
    return next(iter(samples.values()), 0.0)


@pytest.fixture
def replica(repository: Path, tmp_path: Path) -> Iterator[Server]:
    write_model(repository, QUEUEING_MODEL, vector_config(max_batch=0), QUEUEING)
    server = start_server(repository, tmp_path)
    yield server
    assert server.stop() == 0, server.log()


@needs_prometheus
def test_the_queue_query_rises_under_load_and_falls_to_inactive_when_idle(replica, tmp_path):
    trigger = _scaled_object_trigger()
    threshold = float(trigger["threshold"])
    activation = float(trigger["activationThreshold"])
    assert trigger["ignoreNullValues"] == "true"
    service_metric = _inference_service_metric()
    assert service_metric["metric"]["backend"] == "prometheus"
    queries = {
        "ScaledObject": (trigger["query"], threshold),
        "InferenceService": (
            service_metric["metric"]["query"],
            float(service_metric["target"]["value"]),
        ),
    }
    prometheus = Prometheus({POD: replica}, tmp_path)
    try:
        for query, _ in queries.values():
            # scraped, idle: 0, as a sample (no replica at all reads as 0 too)
            prometheus.wait(query, lambda found: found == {"": 0.0})
            assert _as_keda_reads(prometheus, query) <= activation

        load = Load(replica, CLIENTS)
        try:
            for query, target in queries.values():
                # KEDA asks for ceil(value / target) replicas: two or more
                busy = prometheus.wait(
                    query, lambda found, target=target: found.get("", 0.0) > target, timeout=90
                )
                assert math.ceil(busy[""] / target) >= 2
        finally:
            load.stop()

        for query, _ in queries.values():
            # the queue drained and the window slid past it: the trigger is inactive
            prometheus.wait(query, lambda found: found.get("", 1.0) <= activation, timeout=90)
            assert _as_keda_reads(prometheus, query) <= activation
    finally:
        prometheus.stop()
