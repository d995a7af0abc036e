"""deploy/keda and the KEDA InferenceService, offline: the component renders over each
overlay in place of the HorizontalPodAutoscaler, the ScaledObject checks against KEDA's
published types (and the check rejects a broken one), the InferenceService builds into
the KServe SDK's models, and what scaling to zero and back relies on lines up: the queue
series the queries read is one reposerve exports, the interceptor's route and trigger name
each other and the Service, and a replica is ready only once its models are warm."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from reposerve.metrics import GAUGES
from tests.manifests import (
    DEPLOY,
    OVERLAYS,
    TSC,
    TYPED_KINDS,
    container_of,
    core_problems,
    kserve_problems,
    kustomize_commands,
    render,
    serve_settings,
    type_of,
    typed_problems,
    with_component,
)

pytestmark = pytest.mark.tool

KEDA = DEPLOY / "keda"
INFERENCE_SERVICE = DEPLOY / "kserve" / "inferenceservice-keda.yaml"
# The HTTP Add-on publishes no schema package (npm, PyPI) to check its kind against: the
# route is checked by what it names (test_the_interceptor_route_reaches_the_http_port).
INTERCEPTOR_ROUTE = "http.keda.sh/v1beta1/InterceptorRoute"
EXPORTED_GAUGES = {name for name, _, _ in GAUGES}


def _kustomize() -> list[str]:
    command = kustomize_commands()["kustomize"]
    if command is None:
        pytest.skip("kustomize is not installed: run tools/install_deploy_tools.sh")
    return command


def _needs_keda_types() -> None:
    if not (TSC.exists() and (TSC.parents[1] / "@kubernetes-models" / "keda").exists()):
        pytest.skip(
            "typescript or KEDA's types are not installed: run tools/install_deploy_tools.sh"
        )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """An overlay with the component, by kind: rendered once per overlay, a copy each call."""
    by_overlay: dict[str, dict[str, Any]] = {}

    def by_kind(overlay: str) -> dict[str, Any]:
        if overlay not in by_overlay:
            folder = tmp_path_factory.mktemp(overlay)
            documents = render(with_component(folder, overlay, KEDA), _kustomize())
            by_overlay[overlay] = {document["kind"]: document for document in documents}
            assert len(by_overlay[overlay]) == len(documents), "one document of each kind"
        return copy.deepcopy(by_overlay[overlay])

    return by_kind


def _query_metric(query: str) -> str:
    (metric,) = set(re.findall(r"\b(nv_\w+|reposerve_\w+)\{", query))
    return metric


def _prometheus_trigger(scaled_object: dict[str, Any]) -> dict[str, str]:
    (trigger,) = [t for t in scaled_object["spec"]["triggers"] if t["type"] == "prometheus"]
    return trigger["metadata"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_component_replaces_the_autoscaler_and_validates(rendered, overlay, tmp_path):
    documents = rendered(overlay)
    assert set(documents) == {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "ScaledObject",
        "InterceptorRoute",
    }  # no HorizontalPodAutoscaler: KEDA makes its own, and two would fight
    typed = [document for document in documents.values() if type_of(document) in TYPED_KINDS]
    core = [
        document
        for document in documents.values()
        if type_of(document) not in TYPED_KINDS and type_of(document) != INTERCEPTOR_ROUTE
    ]
    assert [problem for document in core for problem in core_problems(document)] == []
    _needs_keda_types()
    assert typed_problems(typed, tmp_path) == []


def test_the_scaled_object_reads_the_queue_down_to_zero(rendered):
    documents = rendered("cpu")
    spec = documents["ScaledObject"]["spec"]
    deployment = documents["Deployment"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert spec["minReplicaCount"] == 0 and spec["maxReplicaCount"] >= 2
    trigger = _prometheus_trigger(documents["ScaledObject"])
    assert _query_metric(trigger["query"]) in EXPORTED_GAUGES
    # the series of this Service's pods, as the ServiceMonitor's scrape labels them
    assert f'job="{documents["Service"]["metadata"]["name"]}"' in trigger["query"]
    # KEDA reads these as numbers: active above the activation, a replica per threshold
    assert 0 <= float(trigger["activationThreshold"]) < float(trigger["threshold"])
    # with no replica there is no series: 0, not a scaler error
    assert trigger["ignoreNullValues"] == "true"


def test_the_interceptor_route_reaches_the_http_port_and_waits_out_a_cold_start(rendered):
    documents = rendered("cpu")
    route = documents["InterceptorRoute"]
    (push,) = [
        t for t in documents["ScaledObject"]["spec"]["triggers"] if t["type"] != "prometheus"
    ]
    assert push["type"] == "external-push"
    # applied first: KEDA asks the Add-on's scaler for the route when it takes the
    # ScaledObject, and without it falls back to a CPU metric that never scales from zero
    assert list(documents).index("InterceptorRoute") < list(documents).index("ScaledObject")
    assert push["metadata"]["interceptorRoute"] == route["metadata"]["name"]
    assert re.fullmatch(r"[a-z0-9.-]+:\d+", push["metadata"]["scalerAddress"])
    target = route["spec"]["target"]
    assert target["service"] == documents["Service"]["metadata"]["name"]
    service_ports = {port["name"]: port for port in documents["Service"]["spec"]["ports"]}
    container = container_of(documents["Deployment"])
    container_ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    settings = serve_settings(container["args"])
    assert container_ports[service_ports[target["portName"]]["targetPort"]] == settings.http_port
    # The interceptor sends the held request once a replica is ready, and ready means
    # every model loaded and warmed (strict readiness), so it is answered warm.
    assert settings.strict_readiness is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    # It holds the request longer than the kubelet lets the server take to start.
    startup = container["startupProbe"]
    held = int(route["spec"]["timeouts"]["readiness"].removesuffix("s"))
    assert held > startup["periodSeconds"] * startup["failureThreshold"]


def test_the_scaled_object_check_rejects_unknown_and_mistyped_fields(rendered, tmp_path):
    _needs_keda_types()
    scaled_object = rendered("cpu")["ScaledObject"]
    misspelt = copy.deepcopy(scaled_object)
    misspelt["spec"]["minReplicaCont"] = 0
    (tmp_path / "a").mkdir()
    (problem,) = typed_problems([misspelt], tmp_path / "a")
    assert "minReplicaCont" in problem
    mistyped = copy.deepcopy(scaled_object)
    mistyped["spec"]["triggers"][0]["metadata"]["threshold"] = 4  # KEDA takes strings
    (tmp_path / "b").mkdir()
    (problem,) = typed_problems([mistyped], tmp_path / "b")
    assert "Type 'number' is not assignable to type 'string'" in problem


def test_the_keda_inference_service_scales_on_the_queue():
    service = yaml.safe_load(INFERENCE_SERVICE.read_text())
    assert kserve_problems(service) == []
    annotations = service["metadata"]["annotations"]
    # KServe makes a ScaledObject only in the RawDeployment (Standard) mode
    assert annotations["serving.kserve.io/autoscalerClass"] == "keda"
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"
    predictor = service["spec"]["predictor"]
    (metric,) = predictor["autoScaling"]["metrics"]
    assert metric["type"] == "External" and metric["external"]["metric"]["backend"] == "prometheus"
    query = metric["external"]["metric"]["query"]
    assert _query_metric(query) in EXPORTED_GAUGES
    # the pods of the Deployment KServe names <name>-predictor
    pods = re.search(r'pod=~"([^"]+)"', query)
    assert pods and re.fullmatch(pods[1], f"{service['metadata']['name']}-predictor-5d9c7-x2k9q")
    assert float(metric["external"]["target"]["value"]) > 0
    # Its only trigger reads the replicas' own series: at zero nothing would wake it.
    assert predictor["minReplicas"] >= 1
