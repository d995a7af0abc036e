"""The architecture's import direction (STYLE.md): a layer imports only layers to its right.

cli (convert) -> server -> http -> grpc -> service -> repository -> pipelines -> scheduler
-> instance -> backends
(the server object starts the fronts: HTTP, gRPC and metrics), and every layer may use the
leaves (protocol, operations, config, errors, datatypes, tensor, statistics, settings,
metrics, quantiles, utilization, access).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "reposerve"
ORDER = [
    "cli",
    "convert",
    "server",
    "http",
    "grpc",
    "service",
    "repository",
    "pipelines",
    "scheduler",
    "instance",
    "backends",
]
LEAVES = {
    "metrics",
    "protocol",
    "operations",
    "config",
    "errors",
    "datatypes",
    "tensor",
    "statistics",
    "quantiles",
    "utilization",
    "settings",
    "logs",
    "access",
    "__init__",
}
# What each leaf may import besides the standard library and numpy/msgspec.
LEAF_RULES = {
    "errors": set(),
    "datatypes": set(),
    "tensor": {"datatypes"},
    "config": {"errors"},
    "statistics": {"quantiles"},
    "quantiles": set(),
    "utilization": set(),
    "metrics": {"statistics", "utilization"},
    "settings": {"metrics"},  # MetricsOptions, the metrics flags as one value
    "logs": {"errors"},
    "access": {"errors", "settings"},  # who may call which API, for every front
    "__init__": {"errors"},  # the package exports InvalidInput for model authors
    # the service's typed arguments and results, which a front in any process can import
    "operations": {"logs", "statistics"},
    "protocol": {
        "config",
        "datatypes",
        "errors",
        "tensor",
        "statistics",
        "operations",
        "__init__",
    },
}
FORBIDDEN_IN_LEAVES = {
    "starlette",
    "uvicorn",
    "hypercorn",
    "multiprocessing",
    "subprocess",
}


def _layer(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _modules() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_right(path):
    layer = _layer(path)
    for name in _imports(path):
        root = name.split(".")[0]
        if root in FORBIDDEN_IN_LEAVES and layer in LEAVES:
            pytest.fail(f"{path.name}: leaf '{layer}' imports {name}")
        if root != "reposerve":
            continue
        parts = name.split(".")
        target = parts[1] if len(parts) > 1 else "__init__"
        if target == layer:
            continue
        if layer in LEAVES:
            assert target in LEAF_RULES[layer], (
                f"{path.relative_to(PACKAGE)}: leaf '{layer}' imports reposerve.{target}"
            )
        elif target not in LEAVES:
            assert ORDER.index(target) > ORDER.index(layer), (
                f"{path.relative_to(PACKAGE)}: '{layer}' imports '{target}', a layer to its left"
            )
