from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server import REPO_ROOT, Server, start_server


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Servers started by tests keep derived model files (fp16 graphs, TensorRT engines)
    in a temporary folder, never in the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REPOSERVE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="session")
def bundled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """reposerve serving the bundled model_repository/."""
    server = start_server(REPO_ROOT / "model_repository", tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "repository"
    root.mkdir()
    return root
