"""tools.gpu_check runs as it is: its CPU-safe phases pass here, the GPU parts are skipped
with a reason where there is no GPU, and every phase leaves its JSON document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server import REPO_ROOT
from tools.gpu_check.node import find_gpus

pytestmark = pytest.mark.e2e


def test_cpu_safe_phases_write_their_json(tmp_path: Path):
    out = tmp_path / "gpu-check"
    result = subprocess.run(
        [
            sys.executable, "-m", "tools.gpu_check", "--out", str(out),
            "--phases", "placement,precision,faults", "--budget-s", "150",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    reports = {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}
    assert set(reports) == {"placement", "precision", "throughput", "faults", "summary"}
    status = {name: report["status"] for name, report in reports.items() if name != "summary"}
    has_gpu = bool(find_gpus()[1])
    assert status == {
        "placement": "passed" if has_gpu else "skipped",
        "precision": "passed",
        "throughput": "skipped",
        "faults": "passed",
    }, result.stdout
    assert reports["throughput"]["reason"] == "not selected (--phases)"
    assert all(check["ok"] for check in reports["placement"]["checks"]), result.stdout
    precision = reports["precision"]["facts"]["per_precision"]
    assert precision["bf16"]["max_abs_diff_vs_served_fp32"] > 0
    sigkill = reports["faults"]["facts"]["sigkill"]
    assert sigkill["back_ready_s"] is not None and sigkill["health_errors"] == []
    if not has_gpu:
        assert reports["placement"]["reason"].startswith("no GPU")
        assert set(reports["faults"]["skipped_parts"]) == {"out of memory", "device assert"}
    assert reports["summary"]["ok"] is True
    assert "gpu_check: PASS" in result.stdout
