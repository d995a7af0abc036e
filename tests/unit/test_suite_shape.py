"""The test suite's own shape: a test file imports helpers, toy models and fakes from the
shared modules beside the tests (``tests/probes.py``, ``tests/toy_models.py``, ...), never
from another test file, so that moving or deleting one test never breaks another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def _test_modules_imported(path: Path) -> list[str]:
    """The test modules (``test_*``) that the file at ``path`` imports, as written."""
    imported = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            # ``from tests.e2e import test_faults`` names the test module as an alias.
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        imported += [name for name in names if name.rsplit(".", 1)[-1].startswith("test_")]
    return imported


def test_no_test_file_imports_from_another_test_file():
    offenders = {
        path.relative_to(TESTS).as_posix(): imported
        for path in sorted(TESTS.rglob("test_*.py"))
        if (imported := _test_modules_imported(path))
    }
    assert offenders == {}, (
        "test files import from other test files; move what they share into a module "
        "named for what it holds (tests/probes.py, tests/toy_models.py, ...)"
    )
