"""Decoupled models written for Triton's python backend, in config.pbtxt folders, served
unchanged: responses sent through each request's response sender (from threads after
execute returned, or from an async execute) stream to tritonclient.grpc in order, each
request ends at its FINAL flag, an error response fails only its request, and a client
that cancels turns is_cancelled() true."""

from __future__ import annotations

import queue
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.server import start_server

pytestmark = pytest.mark.e2e

# Triton's "repeat" pattern: execute starts a thread per request and returns None; the
# thread sends each element of IN as a response, DELAY seconds apart, then FINAL.
REPEAT_THREADS = """
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            import json
            config = json.loads(args["model_config"])
            assert pb_utils.using_decoupled_model_transaction_policy(config)
            self.log = config["parameters"]["log"]["string_value"]

        def execute(self, requests):
            for request in requests:
                values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
                delay = float(pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()[0])
                sender = request.get_response_sender()
                threading.Thread(target=self.repeat, args=(values, delay, sender)).start()
            return None

        def repeat(self, values, delay, sender):
            for index, value in enumerate(values):
                if sender.is_cancelled():
                    with open(self.log, "a") as log:
                        log.write("cancelled\\n")
                    break
                if value < 0:
                    sender.send(
                        pb_utils.InferenceResponse(error=pb_utils.TritonError("negative value")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                    return
                time.sleep(delay)
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([value], np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# The same from an async execute, sending from the coroutine itself.
REPEAT_ASYNC = """
    import asyncio

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.gather(*(self.repeat(request) for request in requests))

        async def repeat(self, request):
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            delay = float(pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()[0])
            sender = request.get_response_sender()
            for index, value in enumerate(values):
                await asyncio.sleep(delay)
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([value], np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# The same, its last response sent with the FINAL flag (no flag-only response after it).
REPEAT_LAST_FINAL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                sender = request.get_response_sender()
                for index, value in enumerate(values):
                    last = index == len(values) - 1
                    sender.send(
                        pb_utils.InferenceResponse(output_tensors=[
                            pb_utils.Tensor("OUT", np.array([value], np.int32)),
                            pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                        ]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0,
                    )
            return None
"""

CONFIG = """
    backend: "python"
    max_batch_size: 0
    model_transaction_policy {{ decoupled: True }}
    input [
      {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
      {{ name: "DELAY" data_type: TYPE_FP32 dims: [ 1 ] }}
    ]
    output [
      {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
      {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }}
    ]
    parameters {{ key: "log" value: {{ string_value: "{log}" }} }}
"""


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("triton_decoupled")
    log = root / "repeat.log"
    models = (
        ("repeat", REPEAT_THREADS),
        ("repeat_async", REPEAT_ASYNC),
        ("repeat_last_final", REPEAT_LAST_FINAL),
    )
    for name, code in models:
        folder = root / "repository" / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(log=log)))
        (folder / "1" / "model.py").write_text(textwrap.dedent(code))
    server = start_server(root / "repository", root)
    yield server, log
    assert server.stop() == 0, server.log()


def _inputs(values: list[int], delay: float) -> list[grpcclient.InferInput]:
    data = grpcclient.InferInput("IN", [len(values)], "INT32")
    data.set_data_from_numpy(np.array(values, np.int32))
    wait = grpcclient.InferInput("DELAY", [1], "FP32")
    wait.set_data_from_numpy(np.array([delay], np.float32))
    return [data, wait]


def _collect(results: queue.Queue, count: int) -> dict[str, list]:
    by_request: dict[str, list] = {}
    for _ in range(count):
        result, error = results.get(timeout=20)
        if error is not None:
            by_request.setdefault("errors", []).append(str(error))
            continue
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        out = result.as_numpy("OUT")
        by_request.setdefault(response.id, []).append((None if out is None else int(out[0]), final))
    return by_request


@pytest.mark.parametrize("model", ["repeat", "repeat_async"])
def test_a_tritons_decoupled_model_streams_each_requests_responses_in_order(triton_server, model):
    server, _ = triton_server
    client = grpcclient.InferenceServerClient(server.grpc_address)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        lengths = {"a": 5, "b": 3, "c": 1}
        for request_id, length in lengths.items():
            values = [10 * len(request_id) + step for step in range(length)]
            client.async_stream_infer(
                model, _inputs(values, 0.01), request_id=request_id,
                enable_empty_final_response=True,
            )  # fmt: skip
        by_request = _collect(results, sum(lengths.values()) + len(lengths))
    finally:
        client.stop_stream()
    for request_id, length in lengths.items():
        values = [10 + step for step in range(length)]
        assert by_request[request_id] == [(value, False) for value in values] + [(None, True)]
    assert client.get_model_config(model).config.model_transaction_policy.decoupled


def test_a_last_response_sent_final_is_marked_final_and_no_empty_one_follows(triton_server):
    """As Triton: the response that carries the FINAL flag says triton_final_response;
    the empty final response asked for is only for a flag sent alone."""
    server, _ = triton_server
    client = grpcclient.InferenceServerClient(server.grpc_address)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        model, options = "repeat_last_final", {"enable_empty_final_response": True}
        client.async_stream_infer(model, _inputs([1, 2, 3], 0), request_id="a", **options)
        first = _collect(results, 3)
        client.async_stream_infer(model, _inputs([4], 0), request_id="b", **options)
        second = _collect(results, 1)  # an empty final for "a" would come first
    finally:
        client.stop_stream()
    assert first == {"a": [(1, False), (2, False), (3, True)]}
    assert second == {"b": [(4, True)]}


def test_an_error_response_fails_only_its_request(triton_server):
    server, _ = triton_server
    client = grpcclient.InferenceServerClient(server.grpc_address)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("repeat", _inputs([1, -1, 3], 0.01), request_id="bad")
        client.async_stream_infer("repeat", _inputs([4, 5], 0.01), request_id="good")
        by_request = _collect(results, 4)
    finally:
        client.stop_stream()
    assert by_request["good"] == [(4, False), (5, False)]
    assert by_request["bad"] == [(1, False)]
    (error,) = by_request["errors"]
    assert error == "negative value"  # the model's own words, as Triton passes them on


def test_a_cancelled_stream_turns_is_cancelled_true(triton_server):
    server, log = triton_server
    log.unlink(missing_ok=True)
    client = grpcclient.InferenceServerClient(server.grpc_address)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer("repeat", _inputs(list(range(500)), 0.02), request_id="long")
    for _ in range(3):
        result, error = results.get(timeout=20)
        assert error is None, error
    client.stop_stream(cancel_requests=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _cancelled(log):
        time.sleep(0.05)
    assert _cancelled(log)


def _cancelled(log: Path) -> bool:
    return log.exists() and "cancelled" in log.read_text()
