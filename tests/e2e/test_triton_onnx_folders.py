"""ONNX model folders as Triton's own tests and examples lay them out, served unchanged:
no config file at all (Triton generates one from the graph), ``reshape`` on inputs and
outputs, string (BYTES) tensors, ``instance_group`` of ``KIND_MODEL``, a model file named
by ``default_model_filename``, and models without inputs. The graphs are built here with
the ``onnx`` package's helper API."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.server import start_server

onnx = pytest.importorskip("onnx", reason="the onnx package is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
from onnx import TensorProto, helper  # noqa: E402

pytestmark = pytest.mark.e2e


def _save(graph, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what every onnxruntime of the extra reads
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _identity(kind: int, shape: list, name_in: str = "INPUT0", name_out: str = "OUTPUT0"):
    return helper.make_graph(
        [helper.make_node("Identity", [name_in], [name_out])],
        "identity",
        [helper.make_tensor_value_info(name_in, kind, shape)],
        [helper.make_tensor_value_info(name_out, kind, shape)],
    )


def _model(root: Path, name: str, graph, config: str | None, filename: str = "model.onnx"):
    _save(graph, root / name / "1" / filename)
    if config is not None:
        (root / name / "config.pbtxt").write_text(textwrap.dedent(config))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx_folders")
    # No config file: Triton reads the backend, tensors and batching from the graph.
    _model(root, "no_config", _identity(TensorProto.FLOAT, ["batch", 4]), None)
    _model(root, "no_config_fixed", _identity(TensorProto.FLOAT, [2, 3]), None)
    # densenet_onnx's shape: the client sends [3, 4], the model takes [1, 3, 2, 2] per item;
    # its output is [1, 2, 1, 1] per item and the client gets [2].
    reshaping = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1),  # [b,1,1,2,2]
            helper.make_node("Reshape", ["s", "shape"], ["y"]),
        ],
        "reshaping",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1, 3, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 1, 2, 1, 1])],
        [
            helper.make_tensor("axes", TensorProto.INT64, [2], [2, 4]),
            helper.make_tensor("shape", TensorProto.INT64, [5], [-1, 1, 2, 1, 1]),
        ],
    )
    _model(
        root,
        "reshaped",
        reshaping,
        """
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 4 ]
                  reshape: { shape: [ 1, 3, 2, 2 ] } } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ]
                   reshape: { shape: [ 1, 2, 1, 1 ] } } ]
        """,
    )
    # Triton's onnx string models (qa's onnx_zero_1_object): strings in, strings out.
    _model(
        root,
        "strings",
        _identity(TensorProto.STRING, [-1, -1]),
        """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
        instance_group [ { kind: KIND_MODEL } ]
        """,
    )
    _model(
        root,
        "renamed",
        _identity(TensorProto.INT32, [-1, 2]),
        """
        platform: "onnxruntime_onnx"
        default_model_filename: "identity_int32.onnx"
        max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] } ]
        """,
        filename="identity_int32.onnx",
    )
    # A graph without inputs (a constant), with only its output declared.
    constant = helper.make_graph(
        [helper.make_node("Constant", [], ["OUTPUT0"], value=helper.make_tensor(
            "c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0]))],
        "constant",
        [],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [3])],
    )  # fmt: skip
    _model(
        root,
        "no_inputs",
        constant,
        """
        platform: "onnxruntime_onnx"
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
        """,
    )
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def client(server):
    client = httpclient.InferenceServerClient(server.address)
    yield client
    client.close()


def _input(name: str, values: np.ndarray, datatype: str) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(values.shape), datatype)
    tensor.set_data_from_numpy(values)
    return tensor


def test_an_onnx_folder_without_config_gets_triton_generated_config(server, client):
    config = client.get_model_config("no_config")
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 4  # Triton's default-max-batch-size
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [4])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [4])
    ]
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client.infer("no_config", [_input("INPUT0", values, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def test_a_graph_without_a_dynamic_first_dimension_does_not_batch(client):
    config = client.get_model_config("no_config_fixed")
    assert config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [2, 3]
    assert "dynamic_batching" not in config


def test_reshape_clients_see_dims_and_the_model_its_reshape(client):
    values = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    result = client.infer("reshaped", [_input("x", values, "FP32")])
    expected = values.reshape(2, 1, 3, 2, 2).sum(axis=(2, 4)).reshape(2, 2)
    np.testing.assert_array_equal(result.as_numpy("y"), expected)
    config = client.get_model_config("reshaped")
    assert config["input"][0]["dims"] == [3, 4]
    assert config["input"][0]["reshape"] == {"shape": [1, 3, 2, 2]}
    assert config["output"][0]["reshape"] == {"shape": [1, 2, 1, 1]}
    metadata = client.get_model_metadata("reshaped")
    assert metadata["inputs"][0]["shape"] == [-1, 3, 4]
    assert metadata["outputs"][0]["shape"] == [-1, 2]


def test_string_tensors_reach_onnxruntime_and_come_back_as_bytes(client):
    values = np.array([[b"hello", b"world"], [b"", "héllo".encode()]], dtype=object)
    result = client.infer("strings", [_input("INPUT0", values, "BYTES")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def test_kind_model_instance_groups_load_and_show_as_kind_model(client):
    config = client.get_model_config("strings")
    assert [group["kind"] for group in config["instance_group"]] == ["KIND_MODEL"]


def test_default_model_filename_names_the_model_file(client):
    values = np.array([[1, 2], [3, 4]], dtype=np.int32)
    result = client.infer("renamed", [_input("INPUT0", values, "INT32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
    assert client.get_model_config("renamed")["default_model_filename"] == "identity_int32.onnx"


def test_a_model_without_inputs_that_declares_only_outputs_serves(server, client):
    assert client.is_model_ready("no_inputs")
    reply = httpx.post(f"{server.url}/v2/models/no_inputs/infer", json={"inputs": []})
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]
