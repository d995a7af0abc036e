"""The architecture's import direction (STYLE.md): a layer imports only layers to its right.

cli (convert, tune) -> ray -> tritonserver -> embedded -> server -> options -> fronts
-> http -> openai -> grpc -> front_service -> service -> shared_memory -> repository
-> pipelines -> scheduler -> instance -> backends (the server object starts the fronts:
HTTP, gRPC and metrics),
and every layer may use the leaves (protocol, operations, config, errors, datatypes,
tensor, statistics, settings, metrics, quantiles, utilization, access, arguments, files,
locations, allocator).
Inside a layer, modules import one another without circles, deferred imports included: a
circle only works while its import order does.
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
    "tune",
    "ray",  # Ray Serve's replicas, each an embedded server behind the HTTP front
    "tritonserver",  # Triton's in-process API, over the embedded server
    "embedded",
    "server",
    "options",
    "fronts",
    "http",
    "openai",
    "grpc",
    "front_service",
    "service",
    "answers",
    "shared_memory",
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
    "framing",
    "arguments",
    "files",
    "locations",
    "allocator",
    "__init__",
}
# What each leaf may import besides the standard library and numpy/msgspec.
LEAF_RULES = {
    "errors": set(),
    "datatypes": set(),
    "tensor": {"datatypes"},
    "config": {"errors", "datatypes"},
    "statistics": {"quantiles"},
    "quantiles": set(),
    "utilization": set(),
    "metrics": {"statistics", "utilization"},
    # MetricsOptions, the metrics flags as one value; Budget, a memory budget flag's
    # ... and a --model-repository's location (a folder, or a bucket's URL)
    "settings": {"metrics", "arguments", "locations"},
    "locations": {"errors"},
    "logs": {"errors", "settings"},  # start_logging: the --log-* flags
    "framing": set(),
    "arguments": set(),
    "files": set(),
    "access": {"errors", "settings"},  # who may call which API, for every front
    # the package exports InvalidInput for model authors, and (deferred, on first use)
    # the embedded server
    "__init__": {"errors", "embedded"},
    # the service's typed arguments and results, which a front in any process can import
    # (a chat model's template among them)
    "operations": {"logs", "statistics", "config"},
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The package's modules ``tree`` imports when it runs: at the top or inside functions,
    not under ``if TYPE_CHECKING:`` (annotations only, never executed), nor in a module's
    own ``__getattr__`` (PEP 562: it runs when an attribute the module lacks is read, once
    the module is whole, so it closes no circle while modules import). ``from a import b``
    names the module ``a.b`` when there is one, else ``a``."""
    found: set[str] = set()
    pending: list[ast.AST] = [
        node
        for node in tree.body
        if not (isinstance(node, ast.FunctionDef) and node.name == "__getattr__")
    ]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module in modules:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
        pending.extend(ast.iter_child_nodes(node))
    return found


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports in ``graph`` (its first module repeated at the end), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return []


def test_no_module_imports_itself_through_others():
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    graph = {
        name: _runtime_imports(ast.parse(path.read_text()), modules) - {name}
        for name, path in paths.items()
    }
    circle = _circle(graph)
    assert not circle, "import circle: " + " -> ".join(circle)


def test_the_circle_finder_finds_circles():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_a_modules_own_getattr_imports_on_use_not_on_import():
    tree = ast.parse(
        "import a\ndef __getattr__(name):\n    from b import c\ndef later():\n    import d\n"
    )
    assert _runtime_imports(tree, {"a", "b", "b.c", "d"}) == {"a", "d"}
