"""deploy/: every manifest rendered and validated strictly by the tools a cluster uses
(kustomize and kubectl, kubernetes-validate, the KServe SDK's models, the Prometheus
Operator's types, yamllint), each validator shown to reject a broken manifest, and the
properties a rolling update and the autoscaler rely on read off the rendered documents."""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests import (
    DEPLOY,
    KSERVE_FILES,
    KSERVE_MODELS,
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
    with_shared_repository,
)

pytestmark = pytest.mark.tool

RENDERERS = kustomize_commands()
ADAPTER_VALUES = DEPLOY / "k8s" / "prometheus-adapter" / "values.yaml"


def _renderer(name: str) -> list[str]:
    command = RENDERERS[name]
    if command is None:
        how = "kubectl is not on PATH" if name == "kubectl" else "run tools/install_deploy_tools.sh"
        pytest.skip(f"{name} is not installed: {how}")
    return command


def _rendered(name: str, overlay: str) -> dict[str, dict[str, Any]]:
    documents = _render_overlay(name, overlay, tuple(_renderer(name)))
    by_kind = {document["kind"]: document for document in documents}
    assert len(by_kind) == len(documents), "one document of each kind"
    return copy.deepcopy(by_kind)


@functools.cache
def _render_overlay(name: str, overlay: str, command: tuple[str, ...]) -> list[dict[str, Any]]:
    return render(DEPLOY / "k8s" / "overlays" / overlay, list(command))


def _needs_typescript() -> None:
    if not TSC.exists():
        pytest.skip("typescript is not installed: run tools/install_deploy_tools.sh")


# -- lint ------------------------------------------------------------------------------------


def test_every_yaml_file_lints_clean():
    files = sorted(str(path) for path in DEPLOY.rglob("*.yaml"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "yamllint",
            "--strict",
            "-c",
            str(DEPLOY / ".yamllint.yaml"),
            *files,
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- plain Kubernetes --------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("renderer", sorted(RENDERERS))
def test_overlays_render_and_core_kinds_validate_strictly(renderer, overlay):
    documents = list(_rendered(renderer, overlay).values())
    assert {document["kind"] for document in documents} == {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "ServiceMonitor",
    }
    core = [document for document in documents if type_of(document) not in TYPED_KINDS]
    assert [problem for document in core for problem in core_problems(document)] == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_monitor_checks_against_the_operators_types(overlay, tmp_path):
    _needs_typescript()
    documents = _rendered("kustomize", overlay).values()
    operator = [document for document in documents if type_of(document) in TYPED_KINDS]
    assert [document["kind"] for document in operator] == ["ServiceMonitor"]
    assert typed_problems(operator, tmp_path) == []


def test_both_renderers_agree():
    if None in RENDERERS.values():
        pytest.skip("kubectl or the pinned kustomize is not installed")
    for overlay in OVERLAYS:
        assert _rendered("kubectl", overlay) == _rendered("kustomize", overlay)


def test_the_shared_repository_component_mounts_a_claim_and_polls(tmp_path):
    documents = render(with_shared_repository(tmp_path, "cpu"), _renderer("kustomize"))
    (deployment,) = [document for document in documents if document["kind"] == "Deployment"]
    assert core_problems(deployment) == []
    container = container_of(deployment)
    settings = serve_settings(container["args"])
    assert settings.model_control_mode == "poll" and settings.repository_poll_secs == 15
    # one broken folder on the shared volume must not take every replica out
    assert settings.strict_readiness is False and settings.exit_on_error is False
    assert {"name": "models", "mountPath": "/mnt/models", "readOnly": True} in container[
        "volumeMounts"
    ]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    claim = next(volume for volume in volumes if volume["name"] == "models")
    assert claim["persistentVolumeClaim"] == {"claimName": "reposerve-models", "readOnly": True}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_rolling_update_loses_nothing(overlay):
    """The replica leaves as reposerve expects: SIGTERM, not ready, grace, drain; the kubelet
    waits longer than both together, and the update never lowers capacity."""
    deployment = _rendered("kustomize", overlay)["Deployment"]
    container = container_of(deployment)
    settings = serve_settings(container["args"])
    assert settings.model_repositories == (Path("/mnt/models"),)
    assert settings.shutdown_grace_secs >= 5
    grace_period = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_period > settings.shutdown_grace_secs + settings.exit_timeout_secs
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert "replicas" not in deployment["spec"]  # the autoscaler owns the count
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {
        "http": settings.http_port,
        "grpc": settings.grpc_port,
        "metrics": settings.metrics_port,
    }
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["startupProbe"]["httpGet"] == container["livenessProbe"]["httpGet"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    cache = {env["name"]: env["value"] for env in container["env"]}["REPOSERVE_CACHE_DIR"]
    assert {cache, "/tmp"} <= mounts  # everything reposerve writes is on a volume


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_and_the_autoscaler_metric_line_up(overlay):
    rendered = _rendered("kustomize", overlay)
    pod_labels = rendered["Deployment"]["spec"]["template"]["metadata"]["labels"]
    selects_pods = [
        rendered["Service"]["spec"]["selector"],
        rendered["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        rendered["Deployment"]["spec"]["selector"]["matchLabels"],
    ]
    assert all(selector and selector.items() <= pod_labels.items() for selector in selects_pods)
    monitor = rendered["ServiceMonitor"]["spec"]
    service_labels = rendered["Service"]["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= service_labels.items()
    service_ports = {port["name"]: port for port in rendered["Service"]["spec"]["ports"]}
    (endpoint,) = monitor["endpoints"]
    assert service_ports[endpoint["port"]]["targetPort"] == "metrics"
    assert endpoint["path"] == "/metrics"
    autoscaler = rendered["HorizontalPodAutoscaler"]["spec"]
    assert autoscaler["scaleTargetRef"]["name"] == rendered["Deployment"]["metadata"]["name"]
    queue_time, cpu = autoscaler["metrics"]
    (rule,) = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    assert queue_time["pods"]["metric"]["name"] == rule["name"]["as"]
    assert cpu["resource"]["name"] == "cpu"
    requests = container_of(rendered["Deployment"])["resources"]["requests"]
    assert "cpu" in requests  # utilisation is measured against it
    budget = rendered["PodDisruptionBudget"]["spec"]
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_the_overlays_pick_their_image_and_the_gpu_one_asks_for_a_gpu():
    cpu = container_of(_rendered("kustomize", "cpu")["Deployment"])
    gpu_rendered = _rendered("kustomize", "gpu")
    gpu = container_of(gpu_rendered["Deployment"])
    assert cpu["image"] == "reposerve:0.1.0" and gpu["image"] == "reposerve:0.1.0-cuda"
    assert "nvidia.com/gpu" not in str(cpu["resources"])
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    tolerations = gpu_rendered["Deployment"]["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


# -- KServe ----------------------------------------------------------------------------------


def _kserve_documents() -> dict[str, dict[str, Any]]:
    return {path.stem: yaml.safe_load(path.read_text()) for path in KSERVE_FILES}


def test_kserve_files_build_into_the_kserve_sdk_models():
    documents = _kserve_documents()
    assert sorted(documents) == [
        "cluster-serving-runtime",
        "inferenceservice-cpu",
        "inferenceservice-gpu",
        "inferenceservice-grpc",
        "inferenceservice-keda",
    ]
    for name, document in documents.items():
        assert type_of(document) in KSERVE_MODELS, name
        assert kserve_problems(document) == [], name


def test_the_serving_runtime_is_what_kserve_routes_to():
    runtime = _kserve_documents()["cluster-serving-runtime"]["spec"]
    (container,) = runtime["containers"]
    assert container["name"] == "kserve-container"
    settings = serve_settings(container["args"])
    assert settings.model_repositories == (Path("/mnt/models"),) and settings.http_port == 8080
    assert settings.metrics_port == 8002 and settings.grpc_port == 9000
    assert runtime["protocolVersions"] == ["v2", "grpc-v2"]
    assert runtime["annotations"]["prometheus.kserve.io/port"] == "8002"
    assert runtime["annotations"]["prometheus.io/port"] == "8002"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    assert container["startupProbe"]["httpGet"] == container["livenessProbe"]["httpGet"]
    # Only our own format is picked automatically: KServe's webhook refuses two runtimes
    # that auto-select one format at the same priority, and its own runtimes claim the rest.
    automatic = [entry for entry in runtime["supportedModelFormats"] if entry["autoSelect"]]
    assert automatic == [{"name": "reposerve", "version": "1", "autoSelect": True, "priority": 1}]
    assert all("priority" not in entry for entry in runtime["supportedModelFormats"][1:])


@pytest.mark.parametrize(
    "name, protocol",
    [
        ("inferenceservice-cpu", "v2"),
        ("inferenceservice-gpu", "v2"),
        ("inferenceservice-grpc", "grpc-v2"),
        ("inferenceservice-keda", "v2"),
    ],
)
def test_the_inference_services_use_the_runtime(name, protocol):
    documents = _kserve_documents()
    runtime = documents["cluster-serving-runtime"]
    settings = serve_settings(runtime["spec"]["containers"][0]["args"])
    predictor = documents[name]["spec"]["predictor"]
    model = predictor["model"]
    assert model["protocolVersion"] == protocol
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {entry["name"] for entry in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats
    assert model["storageUri"]
    # the pod outlives the runtime's grace period and exit timeout: a rollout loses nothing
    grace_period = predictor["terminationGracePeriodSeconds"]
    assert grace_period > settings.shutdown_grace_secs + settings.exit_timeout_secs
    gpus = model["resources"]["limits"].get("nvidia.com/gpu")
    assert gpus == ("1" if name.endswith("gpu") else None)
    if protocol == "grpc-v2":  # KServe routes to the one port the predictor declares
        assert model["ports"] == [
            {"name": "h2c", "containerPort": settings.grpc_port, "protocol": "TCP"}
        ]
        assert "RawDeployment" in documents[name]["metadata"]["annotations"].values()
    else:
        assert "ports" not in model  # KServe's default, 8080


# -- the validators reject what is wrong ---------------------------------------------------------


def test_the_kserve_walk_rejects_unknown_and_mistyped_fields():
    runtime = _kserve_documents()["cluster-serving-runtime"]
    broken = copy.deepcopy(runtime)
    broken["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    broken["spec"]["supportedModelFormats"][0]["priority"] = "2"
    broken["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/"
    problems = kserve_problems(broken)
    assert len(problems) == 3, problems
    assert any("imagePullPolicyy: not a field of V1Container" in problem for problem in problems)
    assert any("priority: int expected" in problem for problem in problems)
    service = _kserve_documents()["inferenceservice-cpu"]
    del service["spec"]["predictor"]["model"]["resources"]["limits"]
    service["spec"]["predictor"]["model"]["protocol"] = "v2"
    assert kserve_problems(service) == [
        "InferenceService.spec.predictor.model.protocol: not a field of V1beta1ModelSpec"
    ]


def test_kubernetes_validate_rejects_unknown_fields():
    deployment = _rendered("kustomize", "cpu")["Deployment"]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    assert core_problems(broken) and not core_problems(deployment)


def test_the_service_monitor_check_rejects_unknown_and_malformed_fields(tmp_path):
    _needs_typescript()
    monitor = _rendered("kustomize", "cpu")["ServiceMonitor"]
    misspelt = copy.deepcopy(monitor)
    misspelt["spec"]["endpoints"][0]["intervall"] = "15s"
    (tmp_path / "a").mkdir()
    (problem,) = typed_problems([misspelt], tmp_path / "a")
    assert "intervall" in problem
    malformed = copy.deepcopy(monitor)
    malformed["spec"]["endpoints"][0]["interval"] = "fifteen seconds"
    (tmp_path / "b").mkdir()
    (problem,) = typed_problems([malformed], tmp_path / "b")
    assert "interval" in problem
