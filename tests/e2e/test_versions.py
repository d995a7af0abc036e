"""Numbered versions and version_policy: which versions load, and addressing them."""

from __future__ import annotations

import httpx
import pytest

from tests.server import start_server
from tests.toy_models import vector_config, write_model

pytestmark = pytest.mark.e2e

# Each version adds its own number, so a reply tells which version ran.
ADD_VERSION = """
    import numpy as np

    class Model:
        def load(self, context):
            self.version = context.version

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + self.version}
"""


def _body() -> dict:
    return {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [0]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    for name, policy in (
        ("latest_default", ""),
        ("latest_two", "version_policy = { latest = 2 }"),
        ("specific", "version_policy = { specific = [1, 3] }"),
        ("every", "version_policy = { all = true }"),
    ):
        for version in (1, 2, 3):
            write_model(root, name, policy + vector_config(size=1), ADD_VERSION, version=version)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize(
    ("model", "versions"),
    [
        ("latest_default", ["3"]),
        ("latest_two", ["2", "3"]),
        ("specific", ["1", "3"]),
        ("every", ["1", "2", "3"]),
    ],
)
def test_policy_selects_versions(server, model, versions):
    metadata = httpx.get(f"{server.url}/v2/models/{model}").json()
    assert metadata["versions"] == versions
    for version in ("1", "2", "3"):
        response = httpx.post(
            f"{server.url}/v2/models/{model}/versions/{version}/infer", json=_body()
        )
        if version in versions:
            assert response.status_code == 200
            assert response.json()["model_version"] == version
            assert response.json()["outputs"][0]["data"] == [float(version)]
        else:
            assert response.status_code == 404
    # Without a version, the newest one answers.
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=_body())
    assert response.json()["model_version"] == versions[-1]


def test_index_lists_every_loaded_version(server):
    index = httpx.post(f"{server.url}/v2/repository/index").json()
    every = [(e["name"], e["version"], e["state"]) for e in index if e["name"] == "every"]
    assert every == [("every", "1", "READY"), ("every", "2", "READY"), ("every", "3", "READY")]


def test_stats_per_version(server):
    httpx.post(f"{server.url}/v2/models/every/versions/2/infer", json=_body())
    stats = httpx.get(f"{server.url}/v2/models/every/versions/2/stats").json()["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("every", "2")]
    assert stats[0]["inference_count"] >= 1
    every = httpx.get(f"{server.url}/v2/models/every/stats").json()["model_stats"]
    assert [s["version"] for s in every] == ["1", "2", "3"]
