"""Shared by the tests of a real instance process without a server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from reposerve.config import parse_model_config
from reposerve.instance.spec import InstanceSpec
from tests.toy_models import write_model


@pytest.fixture
def python_model(repository: Path) -> Callable[..., InstanceSpec]:
    """Writes a python model into the repository; the spec of its instance 0 on the CPU."""

    def make(
        code: str, config: str, model: str = "m", execute_timeout_s: float = 0
    ) -> InstanceSpec:
        folder = write_model(repository, model, config, code)
        parsed = parse_model_config((folder / "config.toml").read_text(), model)
        return InstanceSpec(
            model=model, version=1, version_path=str(folder / "1"), backend="python",
            config_json=msgspec.json.encode(parsed), index=0, kind="cpu", gpu=None, cpus=(),
            threads=1, execute_timeout_s=execute_timeout_s,
        )  # fmt: skip

    return make
