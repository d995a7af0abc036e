"""What Triton's python backend promises a model, over a real server and Triton's clients
(issue 18): a response passes through in the shape the model gave it; request parameters
reach the model and response parameters reach the client; ``requested_output_names()``
names what the client asked for; a model that is not decoupled may answer through its
response senders; BF16 travels through DLPack; a BLS model name read from a BYTES input
works; model code sees an embedded interpreter's ``sys.argv``."""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.probes import wait_for
from tests.server import SERVE_BROKEN, running_server, start_server

pytestmark = pytest.mark.e2e

# One model, steered by the request's parameters, for every case of the contract.
CONTRACT = """
    import json
    import sys

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                parameters = json.loads(request.parameters())
                case = parameters.get("case", "")
                if case == "scalar":  # no batch axis, whatever the config says
                    text = np.array(b"one answer", dtype=np.object_)
                    outputs = [pb_utils.Tensor("TEXT", text)]
                elif case == "requested":  # which outputs the client asked for
                    names = ",".join(request.requested_output_names()).encode()
                    outputs = [pb_utils.Tensor("TEXT", np.array([[names]], dtype=np.object_))]
                elif case == "argv":
                    text = json.dumps(sys.argv).encode()
                    outputs = [pb_utils.Tensor("TEXT", np.array([[text]], dtype=np.object_))]
                else:  # echo the parameters back, as a response parameter and as text
                    text = np.array([[request.parameters().encode()]], dtype=np.object_)
                    outputs = [pb_utils.Tensor("TEXT", text), pb_utils.Tensor("TWICE", x * 2)]
                    del parameters["case"]
                    responses.append(pb_utils.InferenceResponse(outputs, parameters=parameters))
                    continue
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
"""

CONTRACT_PBTXT = """
    backend: "python"
    max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [
      { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },
      { name: "TWICE" data_type: TYPE_FP32 dims: [ 2 ] }
    ]
"""

# Not decoupled, and answering through the senders from threads after execute returned.
SENDERS = """
    import threading

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            def answer(request):
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TWICE", x * 2)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            for request in requests:
                threading.Thread(target=answer, args=(request,)).start()
            return None
"""

SENDERS_PBTXT = """
    backend: "python"
    max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "TWICE" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""

# Triton's BLS example: the model to call comes from a BYTES input, so it is bytes.
BLS = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                called = pb_utils.InferenceRequest(
                    model_name=name, inputs=[x], requested_output_names=["TWICE"]
                ).exec()
                if called.has_error():
                    raise pb_utils.TritonModelException(called.error().message())
                twice = pb_utils.get_output_tensor_by_name(called, "TWICE")
                responses.append(pb_utils.InferenceResponse([twice]))
            return responses
"""

BLS_PBTXT = """
    backend: "python"
    input [
      { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
      { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 2 ] }
    ]
    output [ { name: "TWICE" data_type: TYPE_FP32 dims: [ 1, 2 ] } ]
"""

# Triton's decoupled BLS pattern: the model's own thread calls another model.
DECOUPLED_BLS = """
    import threading

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            def answer(request):
                sender = request.get_response_sender()
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                for _ in range(2):
                    called = pb_utils.InferenceRequest(
                        model_name="senders", inputs=[x], requested_output_names=["TWICE"]
                    ).exec()
                    if called.has_error():
                        raise pb_utils.TritonModelException(called.error().message())
                    twice = called.output_tensors()[0].as_numpy()
                    x = pb_utils.Tensor("INPUT0", twice)
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TWICE", twice)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            for request in requests:
                threading.Thread(target=answer, args=(request,)).start()
            return None
"""

# A decoupled model: as many responses as its input says, each with a parameter.
STREAMER = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                count = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0][0])
                for index in range(count):
                    value = np.full((1, 2), index, np.float32)
                    sender.send(
                        pb_utils.InferenceResponse(
                            [pb_utils.Tensor("TWICE", value)], parameters={"index": index}
                        )
                    )
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""

# Calls the streamer with exec(decoupled=True), or async_exec(decoupled=True) when async.
BLS_STREAM = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        {prefix}def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                call = pb_utils.InferenceRequest(
                    model_name="{callee}", inputs=[x], requested_output_names=["TWICE"]
                )
                seen = []
                for response in {call}:
                    if response.has_error():
                        raise pb_utils.TritonModelException(response.error().message())
                    if not response.output_tensors():
                        seen.append("final")
                        break
                    value = float(response.output_tensors()[0].as_numpy()[0][0])
                    seen.append([value, json.loads(response.parameters()).get("index")])
                text = np.array([[json.dumps(seen).encode()]], dtype=np.object_)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)]))
            return responses
"""

# BLS from a child the model forked: refused at once rather than hung.
FORKS = """
    import os

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            read, write = os.pipe()
            child = os.fork()
            if child == 0:
                tensor = pb_utils.Tensor("INPUT0", np.ones((1, 2), np.float32))
                called = pb_utils.InferenceRequest(
                    model_name="senders", inputs=[tensor], requested_output_names=["TWICE"]
                ).exec()
                os.write(write, called.error().message().encode() if called.has_error() else b"ok")
                os._exit(0)
            os.close(write)
            text = os.read(read, 4096)
            os.waitpid(child, 0)
            out = pb_utils.Tensor("TEXT", np.array([[text]], dtype=np.object_))
            return [pb_utils.InferenceResponse([out]) for _ in requests]
"""

UNTIL_CANCELLED = """
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            def run(sender):
                for _ in range(500):
                    if sender.is_cancelled():
                        break
                    one = pb_utils.Tensor("TWICE", np.ones((1, 2), np.float32))
                    sender.send(pb_utils.InferenceResponse([one]))
                    time.sleep(0.01)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            for request in requests:
                threading.Thread(target=run, args=(request.get_response_sender(),)).start()
            return None
"""

# Triton's decoupled_bls_cancel: takes responses until it has enough, then cancels.
BLS_CANCELS = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0")
            stream = pb_utils.InferenceRequest(
                model_name="until_cancelled", inputs=[x], requested_output_names=["TWICE"]
            ).exec(decoupled=True)
            taken, cancelled = 0, False
            for response in stream:
                if response.has_error():
                    cancelled = response.error().code() == pb_utils.TritonError.CANCELLED
                    break
                if not response.output_tensors():
                    break
                taken += 1
                if taken == 3:
                    stream.cancel()
            text = np.array([[json.dumps([taken >= 3, cancelled]).encode()]], dtype=np.object_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)])]
"""

RAISES = """
    class TritonPythonModel:
        def execute(self, requests):
            lorem_ipsum  # noqa: F821 - Triton's wrong_model
"""

BF16 = """
    import torch
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                try:
                    tensor.as_numpy()
                except pb_utils.TritonModelException:
                    pass
                else:
                    raise RuntimeError("as_numpy() on a BF16 tensor should fail")
                doubled = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()) * 2
                capsule = torch.utils.dlpack.to_dlpack(doubled)
                output = pb_utils.Tensor.from_dlpack("OUTPUT0", capsule)
                responses.append(pb_utils.InferenceResponse([output]))
            return responses
"""

BF16_PBTXT = """
    backend: "python"
    max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_BF16 dims: [ 2 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_BF16 dims: [ 2 ] } ]
"""


def _model(root: Path, name: str, code: str, pbtxt: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(pbtxt))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    _model(root, "contract", CONTRACT, CONTRACT_PBTXT)
    _model(root, "senders", SENDERS, SENDERS_PBTXT)
    _model(root, "bls_by_name", BLS, BLS_PBTXT)
    _model(root, "bf16", BF16, BF16_PBTXT)
    _model(root, "raises", RAISES, SENDERS_PBTXT)
    _model(root, "forks", FORKS, CONTRACT_PBTXT)

    decoupled = SENDERS_PBTXT + "model_transaction_policy { decoupled: true }"
    returns = RAISES.replace("lorem_ipsum  # noqa: F821 - Triton's wrong_model", "return [None]")
    _model(root, "decoupled_returns", returns, decoupled)
    _model(root, "until_cancelled", UNTIL_CANCELLED, decoupled)
    _model(root, "bls_cancels", BLS_CANCELS, CONTRACT_PBTXT)
    _model(root, "decoupled_bls", DECOUPLED_BLS, decoupled)
    _model(root, "streamer", STREAMER, decoupled)
    blocking = BLS_STREAM.format(prefix="", call="call.exec(decoupled=True)", callee="streamer")
    awaiting = BLS_STREAM.format(
        prefix="async ", call="await call.async_exec(decoupled=True)", callee="streamer"
    )
    plain = BLS_STREAM.format(prefix="", call="call.exec(decoupled=True)", callee="senders")
    _model(root, "bls_stream_plain", plain, CONTRACT_PBTXT)
    _model(root, "bls_stream", blocking, CONTRACT_PBTXT)
    _model(root, "bls_stream_async", awaiting, CONTRACT_PBTXT)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


def _infer(server, case: str, outputs: list[str] | None = None, **parameters) -> dict:
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}],
        "parameters": {"case": case, **parameters},
    }
    if outputs is not None:
        body["outputs"] = [{"name": name} for name in outputs]
    reply = httpx.post(f"{server.url}/v2/models/contract/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_response_keeps_the_shape_the_model_gave_it(server):
    reply = _infer(server, "scalar", outputs=["TEXT"])
    assert reply["outputs"] == [
        {"name": "TEXT", "datatype": "BYTES", "shape": [], "data": ["one answer"]}
    ]


def test_request_parameters_reach_the_model_and_response_parameters_the_client(server):
    reply = _infer(server, "echo", flag=True, count=3, word="hi")
    assert reply["parameters"] == {"flag": True, "count": 3, "word": "hi"}
    text = next(output for output in reply["outputs"] if output["name"] == "TEXT")
    # The server's own parameters (binary_data_output, priority, timeout) are not the model's.
    assert json.loads(text["data"][0]) == {"case": "echo", "flag": True, "count": 3, "word": "hi"}

    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        result = client.infer(
            "contract", [tensor], parameters={"case": "echo", "flag": False, "count": 7}
        )
    parameters = result.get_response().parameters
    assert parameters["flag"].bool_param is False and parameters["count"].int64_param == 7
    assert result.as_numpy("TWICE").tolist() == [[2, 2]]


def test_requested_output_names_are_the_clients_and_absent_outputs_are_left_out(server):
    reply = _infer(server, "requested", outputs=["TEXT"])
    assert reply["outputs"][0]["data"] == ["TEXT"]
    # Asked for nothing in particular: every declared output is requested; the model gave
    # only TEXT, and the response holds only TEXT.
    reply = _infer(server, "requested")
    assert [output["name"] for output in reply["outputs"]] == ["TEXT"]
    assert reply["outputs"][0]["data"] == ["TEXT,TWICE"]


def test_a_model_that_is_not_decoupled_may_answer_through_its_senders(server):
    client = httpclient.InferenceServerClient(server.address, concurrency=4)
    arrays = [np.full((1, 2), index, np.float32) for index in range(8)]
    pending = []
    for array in arrays:
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(array)
        pending.append(client.async_infer("senders", [tensor]))
    for array, request in zip(arrays, pending, strict=True):
        assert request.get_result().as_numpy("TWICE").tolist() == (array * 2).tolist()
    client.close()


def test_a_bls_model_name_may_be_bytes(server):
    client = httpclient.InferenceServerClient(server.address)
    name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([b"senders"], dtype=np.object_))
    x = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.5, 2.5]], np.float32))
    result = client.infer("bls_by_name", [name, x])
    assert result.as_numpy("TWICE").tolist() == [[3.0, 5.0]]


def test_a_decoupled_models_own_thread_may_call_models(server):
    answers: list = []
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        client.start_stream(callback=lambda result, error: answers.append((result, error)))
        for _ in range(3):  # at once: each waits on its calls from its own thread
            client.async_stream_infer("decoupled_bls", [tensor])
        wait_for(lambda: len(answers) == 6)
        client.stop_stream()
    assert [error for _, error in answers] == [None] * 6
    values = sorted(result.as_numpy("TWICE").tolist() for result, _ in answers)
    assert values == [[[2.0, 4.0]]] * 3 + [[[4.0, 8.0]]] * 3


@pytest.mark.parametrize("model", ["bls_stream", "bls_stream_async"])
def test_a_decoupled_model_called_through_bls_streams_its_responses(server, model):
    client = httpclient.InferenceServerClient(server.address)
    for count in (3, 0):
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.full((1, 2), count, np.float32))
        text = client.infer(model, [tensor]).as_numpy("TEXT")[0][0]
        assert json.loads(text) == [[float(i), i] for i in range(count)] + ["final"]


def test_a_plain_model_called_as_a_stream_gives_its_one_response(server):
    client = httpclient.InferenceServerClient(server.address)
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.full((1, 2), 3, np.float32))
    text = client.infer("bls_stream_plain", [tensor]).as_numpy("TEXT")[0][0]
    assert json.loads(text) == [[6.0, None]]  # its one response, and no final marker


def test_an_exception_in_execute_reaches_the_client_in_tritons_words(server):
    client = httpclient.InferenceServerClient(server.address)
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("raises", [tensor])
    assert caught.value.message() == (
        "Failed to process the request(s) for model 'raises_0_0', message: NameError: name "
        "'lorem_ipsum' is not defined"
    )


def test_a_decoupled_execute_returning_responses_is_refused_in_tritons_words(server):
    answers: list = []
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        client.start_stream(callback=lambda result, error: answers.append(error))
        client.async_stream_infer("decoupled_returns", [tensor])
        wait_for(lambda: answers)
        client.stop_stream()
    assert (
        "Python model 'decoupled_returns_0_0' is using the decoupled mode and the execute "
        "function must return None."
    ) in str(answers[0])


def test_a_bls_stream_cancelled_by_its_caller_stops_the_callee(server):
    client = httpclient.InferenceServerClient(server.address)
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    text = client.infer("bls_cancels", [tensor]).as_numpy("TEXT")[0][0]
    assert json.loads(text) == [True, True]  # it got its 3, then a CANCELLED end


def test_bls_from_a_forked_child_is_refused_not_hung(server):
    client = httpclient.InferenceServerClient(server.address)
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    text = client.infer("forks", [tensor]).as_numpy("TEXT")[0][0].decode()
    assert "model calls from a process forked by the model are not supported" in text


def test_model_code_sees_an_embedded_interpreters_argv(server):
    reply = _infer(server, "argv", outputs=["TEXT"])
    assert json.loads(reply["outputs"][0]["data"][0]) == [""]


def test_bf16_reaches_the_model_through_dlpack(server):
    pytest.importorskip("torch")
    client = httpclient.InferenceServerClient(server.address)
    tensor = httpclient.InferInput("INPUT0", [1, 2], "BF16")
    # tritonclient sends float32 values as BF16 (exact here) and reads BF16 back as float32.
    tensor.set_data_from_numpy(np.array([[1.5, -2.0]], np.float32), binary_data=True)
    result = client.infer("bf16", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    assert result.get_output("OUTPUT0")["datatype"] == "BF16"
    assert result.as_numpy("OUTPUT0").tolist() == [[3.0, -4.0]]


AUTO_COMPLETE = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            auto_complete_model_config.add_input(
                {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}
            )
            auto_complete_model_config.add_output(
                {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}
            )
            auto_complete_model_config.set_max_batch_size(4)
            auto_complete_model_config.set_dynamic_batching()
            return auto_complete_model_config

        def execute(self, requests):
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy() + 1)]
                )
                for r in requests
            ]
"""


def test_auto_complete_config_fills_in_a_folder_without_a_config_file(tmp_path):
    (tmp_path / "completed" / "1").mkdir(parents=True)
    (tmp_path / "completed" / "1" / "model.py").write_text(textwrap.dedent(AUTO_COMPLETE))
    # The file says 8; the model may not lower it (Triton's rule and words).
    _model(tmp_path, "contradicted", AUTO_COMPLETE, 'backend: "python"\nmax_batch_size: 8')
    with running_server(tmp_path, tmp_path, *SERVE_BROKEN) as server:
        config = httpx.get(f"{server.url}/v2/models/completed/config").json()
        assert config["max_batch_size"] == 4 and "dynamic_batching" in config
        assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
            ("INPUT0", "TYPE_FP32", [2])
        ]
        client = httpclient.InferenceServerClient(server.address)
        tensor = httpclient.InferInput("INPUT0", [2, 2], "FP32")
        tensor.set_data_from_numpy(np.zeros((2, 2), np.float32))
        assert client.infer("completed", [tensor]).as_numpy("OUTPUT0").tolist() == [[1, 1]] * 2
        index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
        assert index["contradicted"]["state"] == "UNAVAILABLE"
        assert (
            "configuration specified max_batch_size 8, but in auto-complete-config function "
            "for model 'contradicted' specified max_batch_size 4"
        ) in index["contradicted"]["reason"]


CUSTOM_METRICS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            counter = pb_utils.MetricFamily.COUNTER
            self.family = pb_utils.MetricFamily("requests_seen", "requests seen", counter)
            self.seen = self.family.Metric(labels={"model": args["model_name"]})
            histogram = pb_utils.MetricFamily.HISTOGRAM
            self.sizes = pb_utils.MetricFamily("input_sum", "input sums", histogram)
            self.sum = self.sizes.Metric(labels={}, buckets=[1.0, 10.0])

        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                self.seen.increment(1)
                self.sum.observe(float(x.sum()))
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TWICE", x * 2)]))
            return responses
"""


def test_a_models_own_metrics_are_scraped_beside_reposerves(tmp_path):
    _model(tmp_path, "metered", CUSTOM_METRICS, SENDERS_PBTXT)
    with running_server(tmp_path, tmp_path) as server:
        client = httpclient.InferenceServerClient(server.address)
        for value in (0.25, 2.0, 30.0):
            tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.full((1, 2), value, np.float32))
            client.infer("metered", [tensor])
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
        for line in [
            "# HELP requests_seen requests seen",
            "# TYPE requests_seen counter",
            'requests_seen{model="metered"} 3',
            "# TYPE input_sum histogram",
            'input_sum_bucket{le="1"} 1',
            'input_sum_bucket{le="10"} 2',
            'input_sum_bucket{le="+Inf"} 3',
            "input_sum_count 3",
            "input_sum_sum 64.5",
        ]:
            assert line in text.splitlines(), line


# Waits until its request is cancelled (checking without sending anything), then records
# that it saw it; decoupled or not by its config.
WATCHES_CANCEL = """
    import threading
    import time
    from pathlib import Path

    import numpy as np
    import triton_python_backend_utils as pb_utils

    RECORD = Path({record!r})


    def wait_for_cancel(watched, name):
        RECORD.joinpath(f"started-{{name}}").touch()
        deadline = time.monotonic() + 30
        while not watched.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.05)
        RECORD.joinpath(name).write_text(str(watched.is_cancelled()))


    class TritonPythonModel:
        def execute(self, requests):
            if {decoupled}:
                for request in requests:
                    sender = request.get_response_sender()

                    def run(sender=sender):
                        wait_for_cancel(sender, "decoupled")
                        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

                    threading.Thread(target=run).start()
                return None
            for request in requests:
                wait_for_cancel(request, "plain")
            error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
"""


def test_a_model_sees_its_request_cancelled_while_it_runs(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    for name, decoupled in (("plain", False), ("decoupled", True)):
        pbtxt = SENDERS_PBTXT + (
            "model_transaction_policy { decoupled: true }" if decoupled else ""
        )
        code = WATCHES_CANCEL.format(record=str(records), decoupled=decoupled)
        _model(tmp_path / "repository", name, code, pbtxt)
    with running_server(tmp_path / "repository", tmp_path) as server:
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        answers = []
        with grpcclient.InferenceServerClient(server.grpc_address) as client:
            call = client.async_infer("plain", [tensor], lambda **answer: answers.append(answer))
            client.start_stream(callback=lambda **answer: answers.append(answer))
            client.async_stream_infer("decoupled", [tensor])
            started = [records / "started-plain", records / "started-decoupled"]
            wait_for(lambda: all(path.exists() for path in started))
            call.cancel()
            client.stop_stream(cancel_requests=True)
        ended = [records / "plain", records / "decoupled"]
        wait_for(lambda: all(path.exists() for path in ended))
        assert (records / "plain").read_text() == "True"
        assert (records / "decoupled").read_text() == "True"


# Triton's bls_parameters pattern: each step adds parameters and calls itself with them.
BLS_PARAMETERS = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                steps = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy()[0])
                parameters = json.loads(request.parameters())
                if steps == 0:
                    text = np.array([json.dumps(parameters).encode()], dtype=np.object_)
                    responses.append(
                        pb_utils.InferenceResponse(
                            [pb_utils.Tensor("AGGREGATED", text)], parameters={"depth": 0}
                        )
                    )
                    continue
                parameters[f"step_{steps}"] = steps
                called = pb_utils.InferenceRequest(
                    model_name="bls_parameters",
                    inputs=[pb_utils.Tensor("STEPS", np.array([steps - 1], np.uint8))],
                    requested_output_names=["AGGREGATED"],
                    parameters=parameters,
                ).exec()
                depth = json.loads(called.parameters())["depth"] + 1
                responses.append(
                    pb_utils.InferenceResponse(called.output_tensors(), parameters={"depth": depth})
                )
            return responses
"""

BLS_PARAMETERS_PBTXT = """
    backend: "python"
    input [ { name: "STEPS" data_type: TYPE_UINT8 dims: [ 1 ] } ]
    output [ { name: "AGGREGATED" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# Calls a model that answers with the timeout its request carries.
TIMED = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                if request.inputs()[0].name() == "STEPS":  # the callee
                    text = str(request.timeout()).encode()
                    out = pb_utils.Tensor("AGGREGATED", np.array([text], dtype=np.object_))
                    responses.append(pb_utils.InferenceResponse([out]))
                    continue
                called = pb_utils.InferenceRequest(
                    model_name="timed",
                    inputs=[pb_utils.Tensor("STEPS", np.array([1], np.uint8))],
                    requested_output_names=["AGGREGATED"],
                    timeout=100_000,
                ).exec()
                responses.append(pb_utils.InferenceResponse(called.output_tensors()))
            return responses
"""

TIMED_PBTXT = """
    backend: "python"
    input [
      { name: "STEPS" data_type: TYPE_UINT8 dims: [ 1 ] optional: true },
      { name: "CALL" data_type: TYPE_UINT8 dims: [ 1 ] optional: true }
    ]
    output [ { name: "AGGREGATED" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def test_bls_requests_carry_parameters_and_a_timeout(tmp_path):
    _model(tmp_path, "bls_parameters", BLS_PARAMETERS, BLS_PARAMETERS_PBTXT)
    _model(tmp_path, "timed", TIMED, TIMED_PBTXT)
    with (
        running_server(tmp_path, tmp_path) as server,
        grpcclient.InferenceServerClient(server.grpc_address) as client,
    ):
        steps = grpcclient.InferInput("STEPS", [1], "UINT8")
        steps.set_data_from_numpy(np.array([3], np.uint8))
        result = client.infer("bls_parameters", [steps], parameters={"from_client": "yes"})
        aggregated = json.loads(result.as_numpy("AGGREGATED")[0])
        assert aggregated == {"from_client": "yes", "step_3": 3, "step_2": 2, "step_1": 1}
        assert result.get_response().parameters["depth"].int64_param == 3

        call = grpcclient.InferInput("CALL", [1], "UINT8")
        call.set_data_from_numpy(np.array([1], np.uint8))
        result = client.infer("timed", [call])
        assert result.as_numpy("AGGREGATED")[0] == b"100000"  # µs, as the model gave it


# Triton's bls_model_loading pattern: a model loads, checks and unloads another.
CONTROLLER = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.config = json.loads(args["model_config"])  # target's tensors are the same

        def execute(self, requests):
            seen = [pb_utils.is_model_ready("target")]
            pb_utils.load_model(model_name="target")
            seen.append(pb_utils.is_model_ready("target"))
            seen.append(pb_utils.is_model_ready("target", "2"))
            try:
                pb_utils.load_model("target", config="{not json")
            except pb_utils.TritonModelException as exc:
                seen.append("refused: " + str(exc)[:40])
            config = {key: self.config[key] for key in ("backend", "input", "output")}
            config["version_policy"] = {"specific": {"versions": [1]}}
            pb_utils.load_model("target", config=json.dumps(config))
            seen += [pb_utils.is_model_ready("target", "1"), pb_utils.is_model_ready("target", "2")]
            pb_utils.unload_model("target")
            seen.append(pb_utils.is_model_ready("target"))
            seen.append(pb_utils.is_model_ready("no_such_model"))
            text = np.array([json.dumps(seen).encode()], dtype=np.object_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("AGGREGATED", text)])]
"""


def test_a_model_loads_checks_and_unloads_another(tmp_path):
    _model(tmp_path, "controller", CONTROLLER, BLS_PARAMETERS_PBTXT)
    _model(tmp_path, "target", BLS_PARAMETERS, BLS_PARAMETERS_PBTXT)
    (tmp_path / "target" / "2").mkdir()
    (tmp_path / "target" / "2" / "model.py").write_text(textwrap.dedent(BLS_PARAMETERS))
    explicit = ("--model-control-mode", "explicit", "--load-model", "controller")
    with running_server(tmp_path, tmp_path, *explicit) as server:
        client = httpclient.InferenceServerClient(server.address)
        steps = httpclient.InferInput("STEPS", [1], "UINT8")
        steps.set_data_from_numpy(np.array([0], np.uint8))
        seen = json.loads(client.infer("controller", [steps]).as_numpy("AGGREGATED")[0])
        assert seen[:3] == [False, True, True]  # the newest version, 2
        assert seen[3].startswith("refused: ")
        assert seen[4:] == [True, False, False, False]  # version 1 by the config; unloaded


BLS_IN_INITIALIZE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            tensor = pb_utils.Tensor("INPUT0", np.zeros((1, 2), np.float32))
            pb_utils.InferenceRequest(
                model_name="senders", inputs=[tensor], requested_output_names=["TWICE"]
            ).exec()

        def execute(self, requests):
            return None
"""

RELATIVE_IMPORT = """
    import triton_python_backend_utils as pb_utils

    from . import helper


    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("TWICE", helper.twice(r.inputs()[0]))])
                for r in requests
            ]
"""

EXITS_IN_INITIALIZE = """
    import os


    class TritonPythonModel:
        def initialize(self, args):
            os._exit(3)

        def execute(self, requests):
            return None
"""


def test_triton_model_folders_fail_and_load_as_triton_says(tmp_path):
    _model(tmp_path, "senders", SENDERS, SENDERS_PBTXT)
    _model(tmp_path, "bls_in_initialize", BLS_IN_INITIALIZE, SENDERS_PBTXT)
    _model(tmp_path, "relative", RELATIVE_IMPORT, SENDERS_PBTXT)
    (tmp_path / "relative" / "1" / "helper.py").write_text(
        "def twice(tensor):\n    return tensor.as_numpy() * 2\n"
    )
    _model(tmp_path, "init_exit", EXITS_IN_INITIALIZE, SENDERS_PBTXT)
    _model(tmp_path, "no_model_file", "", SENDERS_PBTXT)
    (tmp_path / "no_model_file" / "1" / "model.py").unlink()
    server = start_server(tmp_path, tmp_path, *SERVE_BROKEN)
    try:
        index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
        assert index["relative"]["state"] == "READY"
        reasons = {name: entry.get("reason", "") for name, entry in index.items()}
        assert (
            "BLS is only supported during the 'execute' function." in reasons["bls_in_initialize"]
        )
        assert "Stub process 'init_exit_0_0' is not healthy." in reasons["init_exit"]
        missing = tmp_path.resolve() / "no_model_file" / "1" / "model.py"
        assert (
            f"Failed to preinitialize Python stub: Python model file not found in '{missing}'"
        ) in reasons["no_model_file"]
        log = server.log()
        assert "failed to load 'no_model_file'" in log
        assert "failed to load 'init_exit' version 1" in log
        client = httpclient.InferenceServerClient(server.address)
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        assert client.infer("relative", [tensor]).as_numpy("TWICE").tolist() == [[2, 2]]
    finally:
        server.stop()


def test_a_model_loads_from_its_files_alone_and_bad_names_are_refused(tmp_path):
    (tmp_path / "repository").mkdir()
    with running_server(tmp_path / "repository", tmp_path) as server:
        code = textwrap.dedent(SENDERS)
        for name, status in [("TestModel123", 200), ("model;test", 400), ("model{test}", 400)]:
            config = {
                "name": name,
                "backend": "python",
                "max_batch_size": 4,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
                "output": [{"name": "TWICE", "data_type": "TYPE_FP32", "dims": [2]}],
            }
            parameters = {
                "config": json.dumps(config),
                "file:/1/model.py": base64.b64encode(code.encode()).decode(),
            }
            reply = httpx.post(
                f"{server.url}/v2/repository/models/{name}/load",
                json={"parameters": parameters},
                timeout=60,
            )
            assert reply.status_code == status, reply.text
            if status != 200:
                assert "failed to load" in reply.text
                assert "Invalid stub name: contains invalid characters" in reply.text
        client = httpclient.InferenceServerClient(server.address)
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        assert client.infer("TestModel123", [tensor]).as_numpy("TWICE").tolist() == [[2, 2]]


LOGS = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            logger = pb_utils.Logger
            logger.log_info("Info Msg!")
            logger.log_warn("Warning Msg!")
            logger.log_verbose("Verbose Msg!")
            logger.log("Specific Msg!", logger.ERROR)
            return [pb_utils.InferenceResponse([r.inputs()[0]]) for r in requests]
"""


def test_model_log_lines_follow_the_servers_log_settings(tmp_path):
    _model(tmp_path, "logs", LOGS, SENDERS_PBTXT.replace('"TWICE"', '"INPUT0"'))
    with running_server(tmp_path, tmp_path, "--log-verbose", "1") as server:
        client = httpclient.InferenceServerClient(server.address)
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        client.infer("logs", [tensor])
        wait_for(lambda: "Specific Msg!" in server.log())
        settings = {"log_verbose_level": 0, "log_info": False, "log_warning": False}
        assert httpx.post(f"{server.url}/v2/logging", json=settings).status_code == 200
        client.infer("logs", [tensor])
        wait_for(lambda: server.log().count("Specific Msg!") == 2)
        log = server.log()
        assert "reposerve.model.logs: Verbose Msg!" in log  # --log-verbose 1 lets it out
        for line in ("Info Msg!", "Warning Msg!", "Verbose Msg!"):
            assert log.count(line) == 1, line  # not after the settings turned them off


# A decoupled model that sends its last response with the FINAL flag (Triton's
# async_execute_decouple does so), none alone when it has nothing to send.
FINAL_WITH_LAST = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            for request in requests:
                sender = request.get_response_sender()
                count = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0][0])
                if count == 0:
                    sender.send(flags=final)
                for index in range(count):
                    response = pb_utils.InferenceResponse(
                        [pb_utils.Tensor("TWICE", np.full((1, 2), index, np.float32))],
                        parameters={"index": index},
                    )
                    sender.send(response, flags=final if index == count - 1 else 0)
            return None
"""

# An async decoupled model whose requests each wait until GATHERED of them run at once
# (or give up after a while): they answer "together" only if their callers' calls overlap.
GATHERED = 3
GATHERS = """
    import asyncio

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.arrived = 0
            self.everyone = None

        async def execute(self, requests):
            if self.everyone is None:
                self.everyone = asyncio.Event()
            self.arrived += 1
            if self.arrived == {gathered}:
                self.everyone.set()
            try:
                await asyncio.wait_for(self.everyone.wait(), 10)
                word = b"together"
            except asyncio.TimeoutError:
                word = b"alone"
            for request in requests:
                text = pb_utils.Tensor("TEXT", np.array([[word]], dtype=np.object_))
                request.get_response_sender().send(
                    pb_utils.InferenceResponse([text]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            return None
"""

# Each request calls the gathering model with async_exec(decoupled=True).
GATHERS_CALLER = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                call = pb_utils.InferenceRequest(
                    model_name="gathers", inputs=[x], requested_output_names=["TEXT"]
                )
                words = [
                    response.output_tensors()[0].as_numpy()[0][0]
                    for response in await call.async_exec(decoupled=True)
                    if response.output_tensors()  # (not an empty final response)
                ]
                text = np.array([[b",".join(words)]], dtype=np.object_)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)]))
            return responses
"""

# Decoupled: answers every request with FINAL, then raises (Triton's async_execute test).
RAISES_AFTER_FINAL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        {prefix}def execute(self, requests):
            for request in requests:
                out = pb_utils.Tensor("TWICE", np.zeros((1, 2), np.float32))
                request.get_response_sender().send(
                    pb_utils.InferenceResponse([out]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            raise ValueError("{word} raised after the final response")
"""


@pytest.fixture(scope="module")
def decoupled_calls(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    decoupled = SENDERS_PBTXT + "model_transaction_policy { decoupled: true }"
    _model(root, "final_with_last", FINAL_WITH_LAST, decoupled)
    for prefix, call, name in (
        ("", "call.exec(decoupled=True)", "bls_final_with_last"),
        ("async ", "await call.async_exec(decoupled=True)", "bls_final_with_last_async"),
    ):
        code = BLS_STREAM.format(prefix=prefix, call=call, callee="final_with_last")
        _model(root, name, code, CONTRACT_PBTXT)
    text_pbtxt = """
        backend: "python"
        max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
    """
    _model(
        root,
        "gathers",
        GATHERS.format(gathered=GATHERED),
        text_pbtxt + "model_transaction_policy { decoupled: true }",
    )
    _model(root, "gathers_caller", GATHERS_CALLER, text_pbtxt)
    for prefix, word in (("", "sync"), ("async ", "async")):
        code = RAISES_AFTER_FINAL.format(prefix=prefix, word=word)
        _model(root, f"raises_after_final_{word}", code, decoupled)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("model", ["bls_final_with_last", "bls_final_with_last_async"])
def test_a_bls_streams_last_response_is_the_one_sent_with_the_final_flag(decoupled_calls, model):
    # Triton: the iterator ends with the response that carried FINAL; an empty one comes
    # only when the flag is sent alone.
    client = httpclient.InferenceServerClient(decoupled_calls.address)
    for count, expected in ((3, [[0.0, 0], [1.0, 1], [2.0, 2]]), (1, [[0.0, 0]]), (0, ["final"])):
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.full((1, 2), count, np.float32))
        text = client.infer(model, [tensor]).as_numpy("TEXT")[0][0]
        assert json.loads(text) == expected


def test_async_bls_calls_of_concurrent_executes_overlap(decoupled_calls):
    # await async_exec(decoupled=True) lets the instance run its other executes while the
    # callee works, so every caller's call reaches the callee at once.
    client = httpclient.InferenceServerClient(decoupled_calls.address, concurrency=GATHERED)
    pending = []
    for _ in range(GATHERED):
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        pending.append(client.async_infer("gathers_caller", [tensor]))
    words = [request.get_result().as_numpy("TEXT")[0][0] for request in pending]
    client.close()
    assert words == [b"together"] * GATHERED


@pytest.mark.parametrize("word", ["sync", "async"])
def test_an_exception_after_the_final_response_reaches_the_server_log(decoupled_calls, word):
    model = f"raises_after_final_{word}"
    message = f"ValueError: {word} raised after the final response"
    assert message not in decoupled_calls.log()
    answers: list = []
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    with grpcclient.InferenceServerClient(decoupled_calls.grpc_address) as client:
        client.start_stream(callback=lambda result, error: answers.append((result, error)))
        client.async_stream_infer(model, [tensor])
        wait_for(lambda: message in decoupled_calls.log())
        client.stop_stream()
    # The client had its one response; the error, raised after it, went to the log only.
    assert len(answers) == 1 and answers[0][1] is None
