"""Models that call models (Business Logic Scripting): a python model calls two models of
the repository and itself through ``context.infer`` / ``infer_sync``, each call going
through the callee's scheduler; one instance recursing into itself does not deadlock;
a failed call raises in the caller with what went wrong."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.probes import stats
from tests.server import running_server, start_server
from tests.toy_models import XY_CONFIG, XY_DOUBLE, XY_PLUS_ONE, write_model

pytestmark = pytest.mark.e2e

CALLER_CONFIG = """
    max_batch_size = 8
    [[input]]
    name = "X"
    datatype = "FP32"
    shape = [4]
    [[input]]
    name = "DEPTH"
    datatype = "INT32"
    shape = [1]
    [[output]]
    name = "Y"
    datatype = "FP32"
    shape = [4]
    [[instance_group]]
    count = 1
"""
# f(x, d) = (x + 1) + 2x + f(x, d - 1), f(x, 0) = 3x + 1: (d + 1)(3x + 1). A negative depth
# calls a model that does not exist.
SYNC_CALLER = """
    import numpy as np

    class Model:
        def load(self, context):
            self.context = context

        def execute(self, inputs):
            x, depth = inputs["X"], inputs["DEPTH"]
            if (depth < 0).any():
                self.context.infer_sync("no_such_model", {"X": x})
            y = self.context.infer_sync("plus_one", {"X": x})["Y"]
            y = y + self.context.infer_sync("double", {"X": x})["Y"]
            if (depth > 0).any():
                inner = {"X": x, "DEPTH": np.maximum(depth - 1, 0)}
                y = y + self.context.infer_sync(self.context.model_name, inner)["Y"]
            return {"Y": y}
"""
ASYNC_CALLER = """
    import asyncio
    import numpy as np

    class Model:
        def load(self, context):
            self.context = context

        async def execute(self, inputs):
            x, depth = inputs["X"].copy(), inputs["DEPTH"].copy()
            if (depth < 0).any():
                await self.context.infer("no_such_model", {"X": x})
            plus, doubled = await asyncio.gather(
                self.context.infer("plus_one", {"X": x}), self.context.infer("double", {"X": x})
            )
            y = plus["Y"] + doubled["Y"]
            if (depth > 0).any():
                inner = {"X": x, "DEPTH": np.maximum(depth - 1, 0)}
                y = y + (await self.context.infer(self.context.model_name, inner))["Y"]
            return {"Y": y}
"""


# Triton's BLS form: a request built with model_name, exec() for its response; an error
# response (not an exception) when the call fails.
TRITON_BLS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                depth = pb_utils.get_input_tensor_by_name(request, "DEPTH").as_numpy()
                target = "no_such_model" if (depth < 0).any() else "plus_one"
                call = pb_utils.InferenceRequest(
                    model_name=target,
                    inputs=[pb_utils.Tensor("X", x)],
                    requested_output_names=["Y"],
                )
                answer = call.exec()
                if answer.has_error():
                    responses.append(pb_utils.InferenceResponse(error=answer.error()))
                    continue
                y = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y * 10)]))
            return responses
"""


@pytest.fixture(scope="module")
def calls_server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("calls")
    repository = root / "repository"
    write_model(repository, "plus_one", XY_CONFIG, XY_PLUS_ONE)
    write_model(repository, "double", XY_CONFIG, XY_DOUBLE)
    write_model(repository, "caller_sync", CALLER_CONFIG, SYNC_CALLER)
    write_model(repository, "caller_async", CALLER_CONFIG, ASYNC_CALLER)
    write_model(repository, "triton_bls", CALLER_CONFIG, TRITON_BLS)
    server = start_server(repository, root)
    yield server
    assert server.stop() == 0, server.log()


def _call(client, model: str, x: np.ndarray, depth: int):
    inputs = [httpclient.InferInput("X", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs.append(httpclient.InferInput("DEPTH", [len(x), 1], "INT32"))
    inputs[1].set_data_from_numpy(np.full((len(x), 1), depth, np.int32))
    return client.async_infer(model, inputs)


@pytest.mark.parametrize("model", ["caller_sync", "caller_async"])
def test_a_model_calls_two_models_and_itself_on_one_instance(calls_server, model):
    client = httpclient.InferenceServerClient(calls_server.address, concurrency=8)
    before = stats(calls_server, "plus_one")["inference_stats"]["success"]["count"]
    xs = [np.full((1, 4), index, np.float32) for index in range(8)]
    calls = [_call(client, model, x, depth=2) for x in xs]  # 8 at once, each 3 deep
    for x, call in zip(xs, calls, strict=True):
        np.testing.assert_array_equal(call.get_result().as_numpy("Y"), 3 * (3 * x + 1))
    after = stats(calls_server, "plus_one")["inference_stats"]["success"]["count"]
    assert after - before == 8 * 3  # every call went through plus_one's scheduler


@pytest.mark.parametrize("model", ["caller_sync", "caller_async"])
def test_a_failed_call_raises_in_the_caller_with_what_went_wrong(calls_server, model):
    client = httpclient.InferenceServerClient(calls_server.address)
    with pytest.raises(InferenceServerException) as caught:
        _call(client, model, np.ones((1, 4), np.float32), depth=-1).get_result()
    message = caught.value.message()
    assert "ModelCallError" in message and "calling model 'no_such_model'" in message
    assert "Request for unknown model: 'no_such_model' is not found" in message
    # The caller still serves.
    answer = _call(client, model, np.ones((1, 4), np.float32), depth=0).get_result()
    np.testing.assert_array_equal(answer.as_numpy("Y"), np.full((1, 4), 4, np.float32))


def test_a_triton_model_calls_a_model_with_inference_request_exec(calls_server):
    client = httpclient.InferenceServerClient(calls_server.address)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    answer = _call(client, "triton_bls", x, depth=0).get_result()
    np.testing.assert_array_equal(answer.as_numpy("Y"), (x + 1) * 10)
    with pytest.raises(InferenceServerException) as caught:
        _call(client, "triton_bls", x, depth=-1).get_result()
    assert (
        "calling model 'no_such_model': Request for unknown model: 'no_such_model' is not found"
        in str(caught.value)
    )


BIG_SLOW = """
    import time
    import numpy as np

    class Model:
        def execute(self, inputs):
            time.sleep(1.5)
            rows = inputs["X"].shape[0]
            return {"Y": np.zeros((rows, 600_000), np.float32)}  # 2.4 MB a row
"""
BIG_CONFIG = """
    max_batch_size = 8
    [[input]]
    name = "X"
    datatype = "FP32"
    shape = [4]
    [[output]]
    name = "Y"
    datatype = "FP32"
    shape = [600000]
    [dynamic_batching]
    max_queue_delay_microseconds = 300000
"""
IMPATIENT = """
    class Model:
        def load(self, context):
            self.context = context

        def execute(self, inputs):
            self.context.infer_sync("big_slow", {"X": inputs["X"]})
            return {"Y": inputs["X"]}
"""
# Sends a call naming a file it opened, not a call slot: the front must refuse it.
FORGER = """
    import os
    import numpy as np
    from reposerve.instance.messages import Call, TensorRef

    class Model:
        def load(self, context):
            self.context = context
            self.victim = context.config.parameters["victim"]

        def execute(self, inputs):
            caller = self.context.caller
            fd = os.open(self.victim, os.O_RDONLY)
            call_id = 10_000
            caller._slots[call_id] = caller._free.pop() if caller._free else None
            caller._channel.expect(call_id)
            caller._channel.send(
                Call(call_id, fd, 4096, "plus_one", -1, [TensorRef("X", "FP32", (1, 4), 0, 16)])
            )
            reply = caller._channel.wait_call(call_id)
            caller._slots.pop(call_id)
            caller._release(call_id)
            os.close(fd)
            if type(reply).__name__ != "CallFailure" or "not shared memory" not in reply.message:
                raise RuntimeError(f"the front took a plain file as a call slot: {reply}")
            return {"Y": inputs["X"]}
"""


def test_a_caller_killed_mid_call_costs_the_callees_other_requests_nothing(repository, tmp_path):
    """The caller overruns its timeout and is killed while its call runs batched with an
    ordinary request: that request still gets its answer, and the callee stays up."""
    write_model(repository, "big_slow", BIG_CONFIG, BIG_SLOW)
    write_model(
        repository,
        "impatient",
        XY_CONFIG.split("[dynamic_batching]")[0] + "[execution]\ntimeout_seconds = 1\n",
        IMPATIENT,
    )
    with running_server(repository, tmp_path) as server:
        client = httpclient.InferenceServerClient(server.address, concurrency=2)
        x = np.ones((1, 4), np.float32)
        caller = _plain(client, "impatient", x)
        ordinary = _plain(client, "big_slow", x)
        with pytest.raises(InferenceServerException, match="timeout_seconds"):
            caller.get_result()
        assert ordinary.get_result().as_numpy("Y").shape == (1, 600000)
        metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
        restarts = [
            line for line in metrics.splitlines()
            if line.startswith("reposerve_instance_restart_count") and "big_slow" in line
        ]  # fmt: skip
        assert restarts and float(restarts[0].split()[-1]) == 0, restarts  # the callee stayed up


def test_the_front_refuses_a_call_that_names_a_plain_file(repository, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    write_model(repository, "plus_one", XY_CONFIG, XY_PLUS_ONE)
    write_model(
        repository,
        "forger",
        XY_CONFIG + f'\n[parameters]\nvictim = "{victim}"\n',
        FORGER,
    )
    with running_server(repository, tmp_path) as server:
        client = httpclient.InferenceServerClient(server.address)
        x = np.ones((1, 4), np.float32)
        np.testing.assert_array_equal(_plain(client, "forger", x).get_result().as_numpy("Y"), x)
        assert victim.read_text() == "keep me"


def _plain(client, model: str, x: np.ndarray):
    tensor = httpclient.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.async_infer(model, [tensor])
