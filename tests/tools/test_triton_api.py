"""``python -m tools.triton_api``: Triton's API tests, taken from a core checkout or its git
directory, run unchanged with ``import tritonserver`` answered by reposerve's package; each
case's outcome and reason reported. Here a small core of our own stands in for Triton's
(its real tests are run by hand: docs/embedded.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.tool

ROOT = Path(__file__).resolve().parents[2]
TEST_API = """
    import asyncio

    import numpy
    import pytest
    import tritonserver


    def test_the_alias_is_reposerves():
        tensor = tritonserver.Tensor.from_string_array(["x"])
        assert tensor.to_string_array().tolist() == ["x"]
        assert tritonserver.Server.__module__ == "reposerve.tritonserver.server"


    @pytest.mark.asyncio
    async def test_a_coroutine_runs():
        await asyncio.sleep(0)
        assert tritonserver.DataType.FP32 == 11


    def test_one_that_fails():
        assert tritonserver.MemoryType.CPU == 1, "CPU is 0"


    @pytest.mark.skipif(True, reason="Skipping gpu memory, cupy not installed")
    def test_one_that_skips():
        pass
"""


def _core(root: Path) -> Path:
    tests = root / "python" / "test"
    tests.mkdir(parents=True)
    (tests / "test_api.py").write_text(textwrap.dedent(TEST_API))
    return root


def _run(core: Path, out: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tools.triton_api", "--core-repo", str(core)]
    return subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_each_case_is_reported_with_its_reason(tmp_path):
    done = _run(_core(tmp_path / "checkout"), tmp_path / "out")
    assert done.returncode == 1, done.stderr[-2000:]  # a case failed
    lines = done.stdout.splitlines()
    assert "PASSED  test_api::test_the_alias_is_reposerves" in lines
    assert "PASSED  test_api::test_a_coroutine_runs" in lines
    assert "FAILED  test_api::test_one_that_fails: AssertionError: CPU is 0" in lines
    assert "SKIPPED test_api::test_one_that_skips: Skipping gpu memory, cupy not installed" in lines
    assert lines[-1] == "2 passed, 1 failed, 1 skipped"
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["totals"] == {"passed": 2, "failed": 1, "skipped": 1}


def test_a_git_directory_is_read_at_its_head(tmp_path):
    core = _core(tmp_path / "checkout")
    git = ["git", "-C", str(core), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "tests"], check=True)
    done = _run(core / ".git", tmp_path / "out")
    assert done.stdout.splitlines()[-1] == "2 passed, 1 failed, 1 skipped", done.stderr[-2000:]
