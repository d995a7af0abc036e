"""Models written for Triton's python backend (``TritonPythonModel`` + ``pb_utils``) served
unchanged by a real server, the add_sub example in its config.pbtxt folder: their results,
batching by reposerve's scheduler, a response carrying a TritonError failing only its
request, initialize's args and finalize."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.probes import stats
from tests.server import start_server
from tests.toy_models import write_model
from tests.triton_models import ADD_SUB, write_triton_model

pytestmark = pytest.mark.e2e

# add/sub that refuses some requests with a TritonError, records initialize's args and
# writes a marker in finalize (paths from [parameters]).
CHECKED = """
    import json

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.folder = config["parameters"]["record_to"]["string_value"]
            with open(f"{self.folder}/args.json", "w") as file:
                json.dump(args, file)
            pb_utils.Logger.log_info(f"initialized {args['model_instance_name']}")

        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                if (a < 0).any():
                    error = pb_utils.TritonError(
                        f"request '{request.request_id()}': INPUT0 holds a negative value",
                        pb_utils.TritonError.INVALID_ARG,
                    )
                    responses.append(pb_utils.InferenceResponse(error=error))
                elif (a > 1000).any():
                    error = pb_utils.TritonError("INPUT0 is too large for this model")
                    responses.append(pb_utils.InferenceResponse(error=error))
                else:
                    outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
                    responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            return responses

        def finalize(self):
            with open(f"{self.folder}/finalized", "w") as file:
                file.write("finalize ran")
"""

ASYNC_ADD_SUB = """
    import asyncio

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep(0.01)
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            return responses
"""


def _add_sub_config(extra: str = "") -> str:
    return f"""
        backend = "python"
        max_batch_size = 8
        [[input]]
        name = "INPUT0"
        datatype = "FP32"
        shape = [4]
        [[input]]
        name = "INPUT1"
        datatype = "FP32"
        shape = [4]
        [[output]]
        name = "OUTPUT0"
        datatype = "FP32"
        shape = [4]
        [[output]]
        name = "OUTPUT1"
        datatype = "FP32"
        shape = [4]
        {extra}
    """


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("records")


@pytest.fixture(scope="module")
def server(tmp_path_factory, records):
    root = tmp_path_factory.mktemp("repository")
    write_triton_model(
        root,
        "add_sub",
        ADD_SUB,
        "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 20000 }",
    )
    # As Triton's example ships: no batch dimension, each request executed alone.
    write_triton_model(root, "add_sub_unbatched", ADD_SUB)
    # Four requests leave as one batch the moment they are all queued.
    checked = (
        "[dynamic_batching]\npreferred_batch_size = [4]\n"
        "max_queue_delay_microseconds = 2000000\n"
        f'[parameters]\nrecord_to = "{records}"'
    )
    write_model(root, "checked", _add_sub_config(checked), CHECKED)
    # Warmup batches reach execute as one request holding the batch.
    batching = (
        "[dynamic_batching]\nmax_queue_delay_microseconds = 20000\n"
        '[[warmup]]\nbatch_size = 3\ninputs = { INPUT0 = "random" }'
    )
    write_model(root, "add_sub_async", _add_sub_config(batching), ASYNC_ADD_SUB)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


def _inputs(a: np.ndarray, b: np.ndarray) -> list[httpclient.InferInput]:
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
        httpclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_add_sub_results_equal_direct_computation_and_requests_share_batches(server):
    rng = np.random.default_rng(7)
    # Requests of 1 to 3 items each: each InferenceRequest must get exactly its own rows.
    pairs = [
        (
            rng.random((int(items), 4), dtype=np.float32),
            rng.random((int(items), 4), dtype=np.float32),
        )
        for items in rng.integers(1, 4, size=32)
    ]
    client = httpclient.InferenceServerClient(server.address, concurrency=16)
    try:
        pending = [client.async_infer("add_sub", _inputs(a, b)) for a, b in pairs]
        results = [request.get_result() for request in pending]
    finally:
        client.close()
    for (a, b), result in zip(pairs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    served = stats(server, "add_sub")
    assert served["inference_stats"]["success"]["count"] == len(pairs)
    assert served["inference_count"] == sum(len(a) for a, _ in pairs)
    # Batched by reposerve's scheduler: fewer executions than requests.
    assert served["execution_count"] < len(pairs)


@pytest.mark.parametrize(
    ("model", "shape"), [("add_sub_async", (2, 4)), ("add_sub_unbatched", (4,))]
)
def test_async_execute_and_a_model_without_batch_dimension(server, model, shape):
    a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    b = np.full(shape, 0.5, dtype=np.float32)
    client = httpclient.InferenceServerClient(server.address)
    try:
        result = client.infer(model, _inputs(a, b))
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    if model == "add_sub_async":  # its warmup batch of 3 ran before it served
        sizes = [entry["batch_size"] for entry in stats(server, model)["batch_stats"]]
        assert sizes == [2, 3]


def test_an_error_response_fails_only_its_request_in_the_same_batch(server):
    values = [1.0, -1.0, 5000.0, 2.0]

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/v2/models/checked/infer",
                        json={
                            "id": f"r{index}",
                            "inputs": [
                                {"name": name, "shape": [1, 4], "datatype": "FP32", "data": [v] * 4}
                                for name in ("INPUT0", "INPUT1")
                            ],
                        },
                    )
                    for index, v in enumerate(values)
                )
            )

    good, negative, large, other = asyncio.run(send())
    for response, v in ((good, 1.0), (other, 2.0)):
        assert response.status_code == 200, response.text
        outputs = {output["name"]: output["data"] for output in response.json()["outputs"]}
        assert outputs == {"OUTPUT0": [2 * v] * 4, "OUTPUT1": [0.0] * 4}
    # TritonError.INVALID_ARG is the client's fault: 400, as Triton answers it.
    assert negative.status_code == 400
    assert negative.json() == {"error": "request 'r1': INPUT0 holds a negative value"}
    # A TritonError without a code is INTERNAL: 500, as Triton answers it.
    assert large.status_code == 500
    assert large.json() == {"error": "INPUT0 is too large for this model"}
    served = stats(server, "checked")
    # One execution for all four: the failures travelled per request, no isolation re-run.
    assert served["execution_count"] == 1
    assert served["isolation_stats"]["batches"] == 0
    assert served["inference_stats"]["success"]["count"] == 2
    assert served["inference_stats"]["fail"]["count"] == 2


def test_initialize_gets_tritons_args_and_finalize_runs_on_unload(server, records):
    args = json.loads((records / "args.json").read_text())
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert all(isinstance(value, str) for value in args.values())
    assert args["model_name"] == "checked"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] == "checked_0_0"
    assert Path(args["model_repository"]).name == "checked"
    assert (Path(args["model_repository"]) / "1" / "model.py").is_file()
    config = json.loads(args["model_config"])
    assert config["name"] == "checked"
    assert config["max_batch_size"] == 8
    assert [entry["name"] for entry in config["input"]] == ["INPUT0", "INPUT1"]
    assert "reposerve.model.checked: initialized checked_0_0" in server.log()

    assert not (records / "finalized").exists()
    unloaded = httpx.post(f"{server.url}/v2/repository/models/checked/unload", timeout=30)
    assert unloaded.status_code == 200, unloaded.text
    deadline = time.monotonic() + 30
    while not (records / "finalized").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (records / "finalized").read_text() == "finalize ran"
