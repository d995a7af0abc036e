"""Error texts and codes as Triton's clients and tests check them: the server's name, the
unknown-model message, a python model's TritonError reaching the client verbatim with its
code mapped as Triton maps it (HTTP and gRPC), a generate_stream whose first response is
the model's error (an SSE event with the error status), and gRPC streaming's
``triton_grpc_error`` mode (the error ends the stream with its status)."""

from __future__ import annotations

import queue
import textwrap
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server import start_server

pytestmark = pytest.mark.e2e

# Answers each request with TritonError(<its CODE's name>, code): every code Triton has.
CODED = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    CODES = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
             "ALREADY_EXISTS", "CANCELLED"]


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                name = CODES[int(pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0])]
                error = pb_utils.TritonError(f"coded {name}", getattr(pb_utils.TritonError, name))
                responses.append(pb_utils.InferenceResponse(error=error))
            return responses
"""
CODED_PBTXT = """
    backend: "python"
    input [ { name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Triton's L0_http generate test model: REPETITION responses of TEXT, then an error when
# FAIL_LAST (the only response when REPETITION is 0).
REPEATS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                text = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
                count = int(pb_utils.get_input_tensor_by_name(request, "REPETITION").as_numpy()[0])
                sender = request.get_response_sender()
                for _ in range(count):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)]))
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred")),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            return None
"""
REPEATS_PBTXT = """
    backend: "python"
    model_transaction_policy { decoupled: true }
    input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] },
            { name: "REPETITION" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
CODES = [
    # name, Triton's HTTP status, Triton's gRPC status
    ("UNKNOWN", 400, grpc.StatusCode.UNKNOWN),
    ("INTERNAL", 500, grpc.StatusCode.INTERNAL),
    ("NOT_FOUND", 404, grpc.StatusCode.NOT_FOUND),
    ("INVALID_ARG", 400, grpc.StatusCode.INVALID_ARGUMENT),
    ("UNAVAILABLE", 503, grpc.StatusCode.UNAVAILABLE),
    ("UNSUPPORTED", 501, grpc.StatusCode.UNIMPLEMENTED),
    ("ALREADY_EXISTS", 400, grpc.StatusCode.ALREADY_EXISTS),
    ("CANCELLED", 400, grpc.StatusCode.CANCELLED),
]


def _model(root: Path, name: str, code: str, pbtxt: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(pbtxt))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    _model(root, "coded", CODED, CODED_PBTXT)
    _model(root, "repeats", REPEATS, REPEATS_PBTXT)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


def _code(index: int, module) -> object:
    tensor = module.InferInput("CODE", [1], "INT32")
    tensor.set_data_from_numpy(np.array([index], np.int32))
    return tensor


def test_the_server_is_named_triton_by_default(server):
    assert httpx.get(f"{server.url}/v2").json()["name"] == "triton"
    client = grpcclient.InferenceServerClient(server.grpc_address)
    assert client.get_server_metadata().name == "triton"
    client.close()


def test_the_unknown_model_message_is_tritons(server):
    reply = httpx.post(f"{server.url}/v2/models/foo/infer", json={"inputs": []})
    assert reply.json() == {"error": "Request for unknown model: 'foo' is not found"}
    client = grpcclient.InferenceServerClient(server.grpc_address)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("foo", [_code(0, grpcclient)])
    assert caught.value.message() == "Request for unknown model: 'foo' is not found"
    client.close()


@pytest.mark.parametrize(("index", "case"), list(enumerate(CODES)))
def test_a_triton_error_reaches_the_client_verbatim_with_tritons_codes(server, index, case):
    name, http_status, grpc_status = case
    http = httpclient.InferenceServerClient(server.address)
    with pytest.raises(InferenceServerException) as caught:
        http.infer("coded", [_code(index, httpclient)])
    http.close()
    assert (caught.value.status(), caught.value.message()) == (str(http_status), f"coded {name}")
    client = grpcclient.InferenceServerClient(server.grpc_address)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("coded", [_code(index, grpcclient)])
    client.close()
    assert (caught.value.status(), caught.value.message()) == (
        str(grpc_status),
        f"coded {name}",
    )


def _sse(reply: httpx.Response) -> list[str]:
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    return [event for event in reply.text.split("\n\n") if event]


def test_generate_stream_sends_a_first_error_as_an_event_with_the_error_status(server):
    url = f"{server.url}/v2/models/repeats/generate_stream"
    reply = httpx.post(url, json={"PROMPT": ["hello world"], "REPETITION": 0})
    assert reply.status_code == 500  # Triton: the first response sets the status
    assert _sse(reply) == ['data: {"error":"An Error Occurred"}']
    reply = httpx.post(url, json={"PROMPT": ["hello world"], "REPETITION": 1})
    assert reply.status_code == 200
    events = _sse(reply)
    assert len(events) == 2 and '"TEXT":"hello world"' in events[0]
    assert events[1] == 'data: {"error":"An Error Occurred"}'
    # An error in the request itself (before the model runs) stays a JSON reply.
    reply = httpx.post(url, json={"PROMPT": ["hello world"]})
    assert reply.status_code == 400
    assert reply.headers["content-type"] == "application/json"


def _stream(server, headers: dict | None, count: int) -> tuple[list, list]:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    answers: queue.Queue = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)), headers=headers)
    prompt = grpcclient.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"hi"], dtype=object))
    repetition = grpcclient.InferInput("REPETITION", [1], "INT32")
    repetition.set_data_from_numpy(np.array([count], np.int32))
    client.async_stream_infer("repeats", [prompt, repetition])
    results, errors = [], []
    while True:
        result, error = answers.get(timeout=30)
        if error is not None:
            errors.append(error)
            break
        results.append(result)
    client.stop_stream()
    client.close()
    return results, errors


def test_grpc_stream_error_is_a_response_by_default(server):
    results, errors = _stream(server, None, 1)
    assert len(results) == 1
    [error] = errors
    assert error.message() == "An Error Occurred"
    assert error.status() is None  # an error_message inside a ModelStreamInferResponse


def test_triton_grpc_error_mode_ends_the_stream_with_the_status(server):
    results, errors = _stream(server, {"triton_grpc_error": "true"}, 1)
    assert len(results) == 1
    [error] = errors
    assert (error.status(), error.message()) == ("StatusCode.INTERNAL", "An Error Occurred")
