"""Triton's load overrides through tritonclient: ``load_model(config=...)`` loads with that
config instead of the folder's; ``load_model(files=...)`` brings the model folder's files,
accepted as in Triton unless the server was started with --allow-model-file-override false."""

from __future__ import annotations

import json
import textwrap

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server import start_server
from tests.toy_models import PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e

PLUS_TWO = textwrap.dedent(
    """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 2}
    """
).encode()


def _infer(client: httpclient.InferenceServerClient) -> np.ndarray:
    data = np.zeros((1, 16), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT", [1, 16], "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer("plus", [tensor]).as_numpy("OUTPUT")


@pytest.fixture
def plus_repository(repository):
    write_model(repository, "plus", vector_config(extra="[dynamic_batching]"), PLUS_ONE)
    return repository


@pytest.fixture
def client_for():
    started = []

    def start(repository, tmp_path, *args):
        server = start_server(repository, tmp_path, *args)
        client = httpclient.InferenceServerClient(server.address)
        started.append((server, client))
        return server, client

    yield start
    for server, client in started:
        client.close()
        assert server.stop() == 0, server.log()


def test_config_override_changes_max_batch_size(plus_repository, tmp_path, client_for):
    _, client = client_for(plus_repository, tmp_path)
    config = client.get_model_config("plus")
    assert config["max_batch_size"] == 8
    config["max_batch_size"] = 4
    config["parameters"]["reposerve.execution.timeout_seconds"]["string_value"] = "7.5"
    client.load_model("plus", config=json.dumps(config))
    loaded = client.get_model_config("plus")
    assert loaded["max_batch_size"] == 4
    assert loaded["parameters"]["reposerve.execution.timeout_seconds"]["string_value"] == "7.5"
    assert _infer(client).tolist() == [[1.0] * 16]
    # A load without a config reads the folder's again, as in Triton.
    client.load_model("plus")
    assert client.get_model_config("plus")["max_batch_size"] == 8


def test_config_override_without_an_equivalent_names_the_field(
    plus_repository, tmp_path, client_for
):
    _, client = client_for(plus_repository, tmp_path)
    config = client.get_model_config("plus") | {"response_cache": {"enable": True}}
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("plus", config=json.dumps(config))
    assert caught.value.message() == (
        "failed to load 'plus': parameters.config: response_cache: not supported by reposerve"
    )
    assert client.get_model_config("plus")["max_batch_size"] == 8  # still the folder's


def test_file_override_refused_with_the_flag_false(plus_repository, tmp_path, client_for):
    server, client = client_for(plus_repository, tmp_path, "--allow-model-file-override", "false")
    config = json.dumps(client.get_model_config("plus"))
    with pytest.raises(InferenceServerException, match="--allow-model-file-override true"):
        client.load_model("plus", config=config, files={"file:1/model.py": PLUS_TWO})
    reply = httpx.post(
        f"{server.url}/v2/repository/models/plus/load",
        json={"parameters": {"config": config, "file:1/model.py": "cHJpbnQoKQ=="}},
    )
    assert reply.status_code == 403
    # Nor may a config alone point the server's own writes (TensorRT caches) elsewhere.
    document = client.get_model_config("plus")
    cache = {"tensorrt": {"trt_engine_cache_path": str(tmp_path / "elsewhere")}}
    document["parameters"]["onnxruntime"] = {"string_value": json.dumps(cache)}
    reply = httpx.post(
        f"{server.url}/v2/repository/models/plus/load",
        json={"parameters": {"config": json.dumps(document)}},
    )
    assert reply.status_code == 403
    assert "parameters.onnxruntime.tensorrt.trt_engine_cache_path" in reply.json()["error"]
    assert _infer(client).tolist() == [[1.0] * 16]


def test_file_override_loads_the_files_by_default_as_in_triton(
    plus_repository, tmp_path, client_for, monkeypatch
):
    scratch = tmp_path / "scratch"  # the server's temporary folder: where the files go
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    server, client = client_for(plus_repository, tmp_path)
    config = client.get_model_config("plus")
    config["max_batch_size"] = 2
    client.load_model("plus", config=json.dumps(config), files={"file:1/model.py": PLUS_TWO})
    assert _infer(client).tolist() == [[2.0] * 16]
    assert client.get_model_config("plus")["max_batch_size"] == 2
    [folder] = scratch.glob("reposerve-plus-*")
    assert (folder / "plus" / "1" / "model.py").read_bytes() == PLUS_TWO
    # Files need a config, as in Triton; paths stay inside the model folder.
    for parameters, message in (
        ({"file:1/model.py": "cHJpbnQoKQ=="}, "need a config parameter too"),
        ({"config": "{}", "file:../evil.py": "cHJpbnQoKQ=="}, "parameters.file:../evil.py"),
        ({"config": "{}", "file://etc/x.py": "cHJpbnQoKQ=="}, "parameters.file://etc/x.py"),
        ({"config": "{}", "file:/../x.py": "cHJpbnQoKQ=="}, "parameters.file:/../x.py"),
        (
            {"config": "{}", "file:1": "cHJpbnQoKQ==", "file:1/model.py": "cHJpbnQoKQ=="},
            "load 'plus': the override files do not form a model folder",
        ),
    ):
        reply = httpx.post(
            f"{server.url}/v2/repository/models/plus/load", json={"parameters": parameters}
        )
        assert reply.status_code == 400 and message in reply.json()["error"], reply.text
    # Triton's own tests write the key with a leading slash (L0_backend_python's
    # model_control_test: "file:/1/model.py"): the model folder, as without it.
    client.load_model("plus", config=json.dumps(config), files={"file:/1/model.py": PLUS_TWO})
    assert _infer(client).tolist() == [[2.0] * 16]
    client.load_model("plus")  # the repository's folder again
    assert _infer(client).tolist() == [[1.0] * 16]
    assert not list(scratch.glob("reposerve-plus-*"))  # no version runs from them any more
