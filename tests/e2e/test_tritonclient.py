"""The bundled models through NVIDIA's own client: our protocol compatibility oracle."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import reposerve

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(bundled_server):
    client = httpclient.InferenceServerClient(bundled_server.address)
    yield client
    client.close()


def _add_sub_inputs(a: np.ndarray, b: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "INT32"),
        httpclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    # Triton's name, which its clients and scripts check; reposerve's version.
    assert (metadata["name"], metadata["version"]) == ("triton", reposerve.__version__)
    assert "binary_tensor_data" in metadata["extensions"]


def test_health_answers_carry_the_open_inference_protocol_bodies(bundled_server):
    """KServe's clients read these bodies; tritonclient reads the status codes."""
    base = bundled_server.url
    assert httpx.get(f"{base}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{base}/v2/health/ready").json() == {"ready": True}
    ready = httpx.get(f"{base}/v2/models/add_sub/ready")
    assert (ready.status_code, ready.json()) == (200, {"name": "add_sub", "ready": True})
    unknown = httpx.get(f"{base}/v2/models/nope/ready")
    assert (unknown.status_code, unknown.json()) == (400, {"name": "nope", "ready": False})


def test_model_metadata_and_config(client):
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    metadata = client.get_model_metadata("add_sub")
    assert metadata["versions"] == ["1"]
    assert metadata["inputs"] == [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ]
    config = client.get_model_config("add_sub", "1")
    assert config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_INT32"
    assert config["input"][0]["dims"] == [16]
    assert config["output"][1]["name"] == "OUTPUT1"


@pytest.mark.parametrize("binary", [True, False])
def test_add_sub(client, binary):
    rng = np.random.default_rng(1)
    a = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer(
        "add_sub", _add_sub_inputs(a, b, binary), outputs=outputs, request_id="req-7"
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == "req-7"


def test_outputs_subset_and_default_binary(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    only = client.infer(
        "add_sub",
        _add_sub_inputs(a, b, binary=True),
        outputs=[httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)],
    )
    assert [o["name"] for o in only.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - b)
    assert only.as_numpy("OUTPUT0") is None
    # No outputs named: tritonclient asks for every output as binary data.
    every = client.infer("add_sub", _add_sub_inputs(a, b, binary=False), model_version="1")
    np.testing.assert_array_equal(every.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_round_trip(client, binary):
    values = np.array([[b"hello", b"", "wörld".encode()], [b"a", b"bb", b"ccc"]], dtype=object)
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "BYTES")
    tensor.set_data_from_numpy(values, binary_data=binary)
    result = client.infer(
        "identity_bytes",
        [tensor],
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)],
    )
    expected = values.tolist() if binary else [[v.decode() for v in row] for row in values]
    # JSON carries BYTES as strings, so the client hands them back as str.
    assert result.as_numpy("OUTPUT0").tolist() == expected


def test_unknown_model_and_version(client):
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: 'nope' is not found"
    ):
        client.get_model_metadata("nope")
    with pytest.raises(InferenceServerException, match="'add_sub' version 9 is not found"):
        client.get_model_metadata("add_sub", "9")
    assert not client.is_model_ready("add_sub", "9")


def test_statistics(client):
    a = np.zeros((2, 16), dtype=np.int32)
    client.infer("add_sub", _add_sub_inputs(a, a, binary=True))
    stats = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert stats["name"] == "add_sub" and stats["version"] == "1"
    assert stats["inference_count"] >= 2
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert any(entry["batch_size"] >= 1 for entry in stats["batch_stats"])
    every = client.get_inference_statistics()["model_stats"]
    assert {entry["name"] for entry in every} >= {"add_sub", "identity_bytes"}
