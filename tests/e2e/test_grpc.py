"""The gRPC front through NVIDIA's own client (tritonclient.grpc), as the HTTP tests do
through tritonclient.http: same models, same answers, Triton's status codes."""

from __future__ import annotations

import json
import time

import grpc
import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from reposerve.grpc import schema
from tests.server import running_server, self_signed_certificate, start_server
from tests.toy_models import PICKY, PLUS_ONE, vector_config, write_model

grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

pytestmark = pytest.mark.e2e

SLEEPY = """
    import time

    class Model:
        def execute(self, inputs):
            time.sleep(0.5)
            return {"OUTPUT": inputs["INPUT"]}
"""

ECHO_BYTES = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"]}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    batching = "[dynamic_batching]\npreferred_batch_size = [2, 4]\nmax_queue_size = 9"
    write_model(root, "plus_one", vector_config(size=4, extra=batching), PLUS_ONE)
    write_model(root, "plus_one_int", vector_config("INT32", size=4), PLUS_ONE)
    write_model(root, "echo_bytes", vector_config("BYTES", size=-1), ECHO_BYTES)
    write_model(root, "picky", vector_config(size=2), PICKY)
    write_model(root, "spare", vector_config(size=4), PLUS_ONE)
    queue = "[dynamic_batching]\nmax_queue_size = 1"
    write_model(root, "sleepy", vector_config(size=1, max_batch=1, extra=queue), SLEEPY)
    # File overrides off, so the refusal is seen over gRPC too (they are on by default).
    server = start_server(
        root, tmp_path_factory.mktemp("log"), "--allow-model-file-override", "false"
    )
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def client(server):
    client = grpcclient.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _status(call) -> tuple[str, str]:
    """(tritonclient's "StatusCode.X" text, message) of the error ``call`` raises."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status(), caught.value.message()


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "triton"  # Triton's, as its clients check (--server-name)
    assert "binary_tensor_data" in metadata["extensions"]
    assert client.is_model_ready("plus_one")
    assert client.is_model_ready("plus_one", "1")
    assert not client.is_model_ready("no_such_model")
    model = client.get_model_metadata("plus_one_int", as_json=True)
    assert model["versions"] == ["1"]
    assert model["inputs"] == [{"name": "INPUT", "datatype": "INT32", "shape": ["-1", "4"]}]


def test_model_config_matches_the_http_document(client, server):
    import httpx

    config = client.get_model_config("plus_one", as_json=True)["config"]
    http = httpx.get(f"{server.url}/v2/models/plus_one/config").json()
    assert config["name"] == "plus_one"
    assert config["max_batch_size"] == http["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == ["4"]  # int64 as JSON strings, as protobuf writes
    assert config["output"][0]["name"] == "OUTPUT"
    assert config["backend"] == http["backend"]
    # Nothing lost: the HTTP document read with Triton's own full schema says the same.
    theirs = json_format.ParseDict(http, model_config_pb2.ModelConfig())
    assert config == json_format.MessageToDict(theirs, preserving_proto_field_name=True)
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 9


@pytest.mark.parametrize("raw", [True, False])
def test_infer_fp32_and_int32(server, raw):
    # tritonclient sends raw_input_contents; typed contents are built by hand below.
    client = grpcclient.InferenceServerClient(server.grpc_address)
    floats = np.arange(8, dtype=np.float32).reshape(2, 4) / 4
    ints = np.arange(-4, 4, dtype=np.int32).reshape(2, 4)
    if raw:
        result = client.infer("plus_one", [_input("INPUT", floats, "FP32")], request_id="r-1")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), floats + 1)
        assert result.get_response().id == "r-1"
        result = client.infer("plus_one_int", [_input("INPUT", ints, "INT32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), ints + 1)
    else:
        for model, array, field, datatype in (
            ("plus_one", floats, "fp32_contents", "FP32"),
            ("plus_one_int", ints, "int_contents", "INT32"),
        ):
            response = _typed_call(server, model, "INPUT", datatype, array.shape, field, array)
            output = response.outputs[0]
            assert (output.name, output.datatype, list(output.shape)) == (
                "OUTPUT",
                datatype,
                [2, 4],
            )
            answer = np.frombuffer(response.raw_output_contents[0], array.dtype).reshape(2, 4)
            np.testing.assert_array_equal(answer, array + 1)
    client.close()


def _typed_call(server, model, name, datatype, shape, field, values):
    """A ModelInfer with typed ``contents``, over a plain channel with our schema."""
    request = schema.message_class("inference.ModelInferRequest")(model_name=model)
    tensor = request.inputs.add(name=name, datatype=datatype, shape=list(shape))
    items = values if field == "bytes_contents" else np.asarray(values).ravel().tolist()
    getattr(tensor.contents, field).extend(items)
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=schema.message_class("inference.ModelInferResponse").FromString,
        )
        return call(request, timeout=30)


def test_infer_bytes_raw_and_typed(client, server):
    words = np.array([[b"alpha", b"", b"\x00\xffbin"]], dtype=np.object_)
    result = client.infer("echo_bytes", [_input("INPUT", words, "BYTES")])
    assert result.as_numpy("OUTPUT").tolist() == words.tolist()
    typed = [b"typed", b"\x01"]
    response = _typed_call(server, "echo_bytes", "INPUT", "BYTES", (1, 2), "bytes_contents", typed)
    raw = response.raw_output_contents[0]  # framed: 4-byte little-endian length, then bytes
    assert raw == b"".join(len(item).to_bytes(4, "little") + item for item in typed)


def test_statistics_count_grpc_requests(client):
    before = client.get_inference_statistics("plus_one", as_json=True)["model_stats"][0]
    client.infer("plus_one", [_input("INPUT", np.zeros((1, 4), np.float32), "FP32")])
    after = client.get_inference_statistics("plus_one", as_json=True)["model_stats"][0]
    assert int(after.get("inference_count", 0)) == int(before.get("inference_count", 0)) + 1
    assert after["name"] == "plus_one" and after["version"] == "1"


def test_repository_index_load_and_unload(client):
    names = {model["name"] for model in client.get_model_repository_index(as_json=True)["models"]}
    assert {"plus_one", "spare", "echo_bytes"} <= names
    client.unload_model("spare")
    assert not client.is_model_ready("spare")
    client.load_model("spare")
    assert client.is_model_ready("spare")
    # Triton's override: a JSON config as the config parameter (string_param).
    config = client.get_model_config("spare", as_json=True)["config"]
    config["max_batch_size"] = 4
    client.load_model("spare", config=json.dumps(config))
    assert client.get_model_config("spare", as_json=True)["config"]["max_batch_size"] == 4
    status, message = _status(lambda: client.load_model("spare", config="{not json"))
    assert status == "StatusCode.INVALID_ARGUMENT", message
    # Model files in a load are code this server would run: refused with
    # --allow-model-file-override false, as over HTTP (403 there).
    files = {"file:1/model.py": b"class Model: ..."}
    status, message = _status(
        lambda: client.load_model("spare", config=json.dumps(config), files=files)
    )
    assert status == "StatusCode.PERMISSION_DENIED", message
    assert "--allow-model-file-override" in message


def test_errors_carry_tritons_status_codes(client):
    good = _input("INPUT", np.zeros((1, 4), np.float32), "FP32")
    status, message = _status(lambda: client.infer("no_such_model", [good]))
    assert status == "StatusCode.NOT_FOUND", message
    wrong = _input("INPUT", np.zeros((1, 3), np.float32), "FP32")
    status, message = _status(lambda: client.infer("plus_one", [wrong]))
    assert status == "StatusCode.INVALID_ARGUMENT" and "INPUT" in message
    status, message = _status(
        lambda: client.infer("picky", [_input("INPUT", np.array([[-2, 0]], np.float32), "FP32")])
    )
    assert status == "StatusCode.INTERNAL", message
    status, message = _status(
        lambda: client.infer("picky", [_input("INPUT", np.array([[-1, 0]], np.float32), "FP32")])
    )
    assert status == "StatusCode.INVALID_ARGUMENT", message
    status, message = _status(lambda: client.get_model_metadata("no_such_model"))
    assert status == "StatusCode.NOT_FOUND", message


def test_typed_contents_that_do_not_fill_the_shape_are_invalid(server):
    with pytest.raises(grpc.RpcError) as caught:
        _typed_call(server, "plus_one", "INPUT", "FP32", (1, 4), "fp32_contents", [1, 2, 3])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INPUT" in caught.value.details()


def test_health_check_service(server):
    request = schema.message_class("grpc.health.v1.HealthCheckRequest")()
    with grpc.insecure_channel(server.grpc_address) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=schema.message_class(
                "grpc.health.v1.HealthCheckResponse"
            ).FromString,
        )
        assert check(request, timeout=10).status == 1  # SERVING


def test_restricted_protocol_needs_its_metadata_key(tmp_path):
    root = tmp_path / "repository"
    write_model(root, "plus_one", vector_config(size=4), PLUS_ONE)
    with running_server(
        root, tmp_path, "--grpc-restricted-protocol", "model-repository,statistics:admin-key=s3cret"
    ) as server:
        client = grpcclient.InferenceServerClient(server.grpc_address)
        status, message = _status(lambda: client.unload_model("plus_one"))
        assert status == "StatusCode.UNAVAILABLE"
        # Triton's rule: the key travels as metadata under its triton-grpc-protocol- prefix.
        expected = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
        assert expected in message
        status, _ = _status(lambda: client.get_inference_statistics("plus_one"))
        assert status == "StatusCode.UNAVAILABLE"
        assert client.is_model_ready("plus_one")  # health is not restricted
        status, _ = _status(
            lambda: client.unload_model("plus_one", headers={"admin-key": "s3cret"})
        )
        assert status == "StatusCode.UNAVAILABLE"
        client.unload_model("plus_one", headers={"triton-grpc-protocol-admin-key": "s3cret"})
        assert not client.is_model_ready("plus_one")
        client.close()


def test_allow_grpc_false_serves_http_only(tmp_path):
    root = tmp_path / "repository"
    write_model(root, "plus_one", vector_config(size=4), PLUS_ONE)
    with running_server(root, tmp_path, "--allow-grpc", "false") as server:
        client = grpcclient.InferenceServerClient(server.grpc_address)
        status, _ = _status(lambda: client.is_server_live(client_timeout=2))
        assert status == "StatusCode.UNAVAILABLE"  # nothing listens there
        client.close()


def _plus_one_once(client) -> None:
    result = client.infer("plus_one", [_input("INPUT", np.ones((1, 4), np.float32), "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), np.full((1, 4), 2, np.float32))


def test_tls(tmp_path):
    cert, key = self_signed_certificate(tmp_path)
    root = tmp_path / "repository"
    write_model(root, "plus_one", vector_config(size=4), PLUS_ONE)
    flags = ("--grpc-use-ssl", "true", "--grpc-server-cert", cert, "--grpc-server-key", key)
    with running_server(root, tmp_path, *flags) as server:
        secure = grpcclient.InferenceServerClient(
            server.grpc_address, ssl=True, root_certificates=cert
        )
        _plus_one_once(secure)
        secure.close()
        plain = grpcclient.InferenceServerClient(server.grpc_address)
        status, _ = _status(lambda: plain.is_server_live(client_timeout=2))
        assert status == "StatusCode.UNAVAILABLE"  # a plaintext client cannot talk to it
        plain.close()


def test_mutual_tls_needs_a_client_certificate(tmp_path):
    cert, key = self_signed_certificate(tmp_path)
    root = tmp_path / "repository"
    write_model(root, "plus_one", vector_config(size=4), PLUS_ONE)
    flags = ("--grpc-use-ssl-mutual", "true", "--grpc-root-cert", cert)
    with running_server(
        root, tmp_path, *flags, "--grpc-server-cert", cert, "--grpc-server-key", key
    ) as server:
        known = grpcclient.InferenceServerClient(
            server.grpc_address,
            ssl=True,
            root_certificates=cert,
            private_key=key,
            certificate_chain=cert,
        )
        _plus_one_once(known)
        known.close()
        anonymous = grpcclient.InferenceServerClient(
            server.grpc_address, ssl=True, root_certificates=cert
        )
        status, _ = _status(lambda: anonymous.is_server_live(client_timeout=5))
        assert status == "StatusCode.UNAVAILABLE"  # the handshake fails without one
        anonymous.close()


def test_a_taken_grpc_port_fails_the_start(tmp_path):
    import socket

    root = tmp_path / "repository"
    write_model(root, "plus_one", vector_config(size=4), PLUS_ONE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        with pytest.raises(RuntimeError, match="reposerve exited") as caught:
            start_server(root, tmp_path, "--grpc-port", port)
    assert f"could not listen on 127.0.0.1:{port}" in str(caught.value)


def test_classification_answers_as_over_http(client, server):
    import tritonclient.http as httpclient

    values = np.array([[0.5, 3.0, -1.0, 2.0]], np.float32)
    result = client.infer(
        "plus_one",
        [_input("INPUT", values, "FP32")],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT", class_count=2)],
    )
    http = httpclient.InferenceServerClient(server.address)
    tensor = httpclient.InferInput("INPUT", [1, 4], "FP32")
    tensor.set_data_from_numpy(values)
    expected = http.infer(
        "plus_one", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT", class_count=2)]
    )
    http.close()
    assert result.as_numpy("OUTPUT").tolist() == expected.as_numpy("OUTPUT").tolist()
    assert result.as_numpy("OUTPUT").tolist() == [[b"4.000000:1", b"3.000000:3"]]


def test_a_full_queue_is_unavailable(server):
    from concurrent.futures import ThreadPoolExecutor

    def call(_: int) -> str:
        with grpcclient.InferenceServerClient(server.grpc_address) as client:
            try:
                client.infer("sleepy", [_input("INPUT", np.ones((1, 1), np.float32), "FP32")])
            except InferenceServerException as exc:
                return exc.status()
            return "OK"

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(call, range(6)))
    # One runs, one waits in the queue of 1; the others are turned away at once.
    assert "OK" in outcomes
    assert "StatusCode.UNAVAILABLE" in outcomes
    assert set(outcomes) == {"OK", "StatusCode.UNAVAILABLE"}


def test_a_running_rpc_finishes_through_a_graceful_stop(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path / "repository"
    write_model(root, "sleepy", vector_config(size=1, max_batch=1), SLEEPY)
    server = start_server(root, tmp_path)
    client = grpcclient.InferenceServerClient(server.grpc_address)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            client.infer, "sleepy", [_input("INPUT", np.full((1, 1), 7, np.float32), "FP32")]
        )
        time.sleep(0.2)  # the call is in the model now
        assert server.stop() == 0, server.log()
        assert running.result(timeout=30).as_numpy("OUTPUT").tolist() == [[7.0]]
    client.close()
