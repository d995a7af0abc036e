"""A short soak: load, bad items, hung requests, malformed requests, instance kills,
reloads and unloads all at once, with sequences (some abandoned), client shared-memory
regions, on-demand churn with an ensemble and unknown model names beside them; then
SIGTERM with requests queued behind a hung model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.server import REPO_ROOT

pytestmark = pytest.mark.e2e


def test_short_soak_passes():
    result = subprocess.run(
        [sys.executable, "-m", "tools.soak", "--duration", "12", "--fault-every", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "soak: PASS" in result.stdout
    assert "fault: instance killed" in result.stdout
    assert "fault: model reloaded" in result.stdout
    assert "fault: model unloaded" in result.stdout
    assert "poisoned request answered as it should" in result.stdout
    assert "4  queued at SIGTERM: JSON error in time" in result.stdout
    assert "SIGTERM: exit 0 within the budget" in result.stdout
    assert " answered, 0 lost" in result.stdout
    for surface in (
        "sequence answered in full",
        "request through a region answered as it should",
        "lying region registration refused",
        "on-demand request answered as it should",
        "ensemble request answered as it should",
        "unknown model name answered 404",
    ):
        assert surface in result.stdout
