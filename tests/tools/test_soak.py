"""A short soak: load, malformed requests, instance kills and reloads all at once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.server import REPO_ROOT

pytestmark = pytest.mark.e2e


def test_short_soak_passes():
    result = subprocess.run(
        [sys.executable, "-m", "tools.soak", "--duration", "6", "--fault-every", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "soak: PASS" in result.stdout
    assert "fault: instance killed" in result.stdout
    assert "fault: model reloaded" in result.stdout
