"""``reposerve.tritonserver``, Triton's in-process API over an embedded server: a real
repository, real instance processes; Triton's calls, tensors, iterators and error
classes; and a snippet written for Triton's ``tritonserver`` run by changing its import."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import reposerve.tritonserver as tritonserver
from tests.toy_models import (
    COUNTING_SYNC,
    ERROR,
    PLUS_ONE,
    counting_config,
    vector_config,
    write_model,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ECHO_TEXT_CONFIG = """
    [[input]]
    name = "TEXT"
    datatype = "BYTES"
    shape = [-1, -1]
    [[output]]
    name = "TEXT"
    datatype = "BYTES"
    shape = [-1, -1]
"""
ECHO_TEXT = """
    class Model:
        def execute(self, inputs):
            return {"TEXT": inputs["TEXT"]}
"""
MODELS = ["plus_one", "counting", "echo_text", "picky"]


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_model(root, "plus_one", vector_config(size=4), PLUS_ONE)
    write_model(root, "counting", counting_config(tmp_path / "counting.log"), COUNTING_SYNC)
    write_model(root, "echo_text", ECHO_TEXT_CONFIG, ECHO_TEXT)
    write_model(root, "picky", vector_config(size=4), ERROR)
    return root


@pytest.fixture
def server(repository):
    options = tritonserver.Options(
        model_repository=str(repository),
        model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
        startup_models=MODELS,
    )
    server = tritonserver.Server(options).start(wait_until_ready=True)
    yield server
    server.stop()


def _rows(count: int, first: float = 0.0) -> np.ndarray:
    return (np.arange(count * 4, dtype=np.float32) + first).reshape(count, 4)


def _counting(count: int, size: int = 2) -> dict[str, np.ndarray]:
    return {
        "COUNT": np.array([count], np.int32),
        "DELAY": np.array([0.0], np.float32),
        "SIZE": np.array([size], np.int32),
    }


def test_a_models_responses_are_tensors_that_numpy_reads_through_dlpack(server):
    assert server.live() and server.ready()
    models = server.models()
    assert sorted(models) == sorted((name, 1) for name in MODELS)
    assert models["plus_one"].name == "plus_one" and models[("plus_one", 1)].state == "READY"
    with pytest.raises(KeyError, match="Unknown Model: missing"):
        models["missing"]

    (response,) = server.model("plus_one").infer(inputs={"INPUT": _rows(2)})
    assert response.final and response.error is None and response.model.name == "plus_one"
    output = response.outputs["OUTPUT"]
    assert output.data_type == tritonserver.DataType.FP32 and list(output.shape) == [2, 4]
    assert output.memory_type == tritonserver.MemoryType.CPU and output.size == 32
    np.testing.assert_array_equal(np.from_dlpack(output), _rows(2) + 1)

    request = server.model("plus_one").create_request(inputs={"INPUT": _rows(1)}, request_id="r-7")
    (named,) = server.model("plus_one", 1).infer(request)
    assert named.request_id == "r-7"

    text = tritonserver.Tensor.from_string_array([["héllo", "wörld"]])
    (echoed,) = server.model("echo_text").infer(inputs={"TEXT": text})
    assert echoed.outputs["TEXT"].to_string_array().tolist() == [["héllo", "wörld"]]
    (listed,) = server.model("echo_text").infer(inputs={"TEXT": [[b"a", b"bc"]]})
    assert listed.outputs["TEXT"].to_bytes_array().tolist() == [[b"a", b"bc"]]
    assert server.model("plus_one").batch_properties() == tritonserver.ModelBatchFlag.FIRST_DIM
    assert server.model("plus_one").metadata()["inputs"][0]["name"] == "INPUT"


def test_async_infer_and_a_response_queue_get_each_response(server):
    async def main() -> None:
        responses: asyncio.Queue = asyncio.Queue()
        model = server.model("plus_one")
        iterators = [
            model.async_infer(inputs={"INPUT": _rows(1, first=10 * n)}, response_queue=responses)
            for n in range(4)
        ]
        queued = [await responses.get() for _ in iterators]  # before any iteration
        firsts = sorted(float(np.from_dlpack(r.outputs["OUTPUT"])[0, 0]) for r in queued)
        assert firsts == [1.0, 11.0, 21.0, 31.0]
        for n, iterator in enumerate(iterators):
            async for response in iterator:
                np.testing.assert_array_equal(
                    np.from_dlpack(response.outputs["OUTPUT"]), _rows(1, first=10 * n) + 1
                )
        assert responses.empty()

    asyncio.run(main())

    simple: queue.SimpleQueue = queue.SimpleQueue()
    iterator = server.model("plus_one").infer(inputs={"INPUT": _rows(1)}, response_queue=simple)
    assert simple.get(timeout=60).final  # hang detector, generous
    assert [r.final for r in iterator] == [True]


def test_a_decoupled_models_responses_stream_and_end_with_an_empty_final_one(server, tmp_path):
    model = server.model("counting")
    assert model.transaction_properties() == tritonserver.ModelTxnPropertyFlag.DECOUPLED
    responses = list(model.infer(inputs=_counting(4)))
    assert [int(np.from_dlpack(r.outputs["OUT"])[0]) for r in responses[:-1]] == [0, 1, 2, 3]
    assert [r.final for r in responses] == [False] * 4 + [True]
    assert responses[-1].outputs == {}
    assert responses[0].outputs["BLOB"].to_bytes_array().tolist() == [b"xx"]

    failing = list(model.infer(inputs=_counting(10, size=3), raise_on_error=False))
    assert len(failing) == 4 and failing[-1].final
    assert isinstance(failing[-1].error, tritonserver.InternalError)
    assert "fails after three responses" in str(failing[-1].error)

    endless = {**_counting(1000), "DELAY": np.array([0.01], np.float32)}
    iterator = model.infer(inputs=endless, raise_on_error=False)
    assert not next(iterator).final
    iterator.cancel()
    *_, last = iterator  # what came before the cancel reached the model, then the end
    assert last.final and "the request was cancelled" in str(last.error)
    log = tmp_path / "counting.log"
    deadline = 60.0
    while "cancelled" not in log.read_text() and deadline > 0:  # hang detector, generous
        deadline -= 0.05
        threading.Event().wait(0.05)
    assert "cancelled" in log.read_text()  # the model saw its request cancelled


def test_load_takes_tritons_config_override(server):
    override = {
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    model = server.load("plus_one", {"config": json.dumps(override)})
    assert model.config()["max_batch_size"] == 0
    assert model.batch_properties() == tritonserver.ModelBatchFlag.UNKNOWN
    (response,) = model.infer(inputs={"INPUT": _rows(1)[0]})
    np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT"]), _rows(1)[0] + 1)
    with pytest.raises(tritonserver.InvalidArgumentError, match="load parameter 'nope'"):
        server.load("plus_one", {"nope": "1"})
    server.unload("plus_one", wait_until_unloaded=True)
    assert server.models()[("plus_one", 1)].state == "UNAVAILABLE"


def test_errors_are_tritons_classes_with_clear_messages(server):
    plus_one = server.model("plus_one")
    with pytest.raises(tritonserver.NotFoundError, match="unknown model: 'missing'"):
        server.model("missing").infer(inputs={"INPUT": _rows(1)})
    with pytest.raises(tritonserver.InvalidArgumentError, match="unknown input 'NOPE'"):
        plus_one.infer(inputs={"NOPE": _rows(1)})
    with pytest.raises(tritonserver.InvalidArgumentError, match="expected datatype FP32"):
        plus_one.infer(inputs={"INPUT": _rows(1).astype(np.float64)})
    with pytest.raises(tritonserver.InvalidArgumentError, match="request parameter 'bad'"):
        plus_one.infer(inputs={"INPUT": _rows(1)}, parameters={"bad": [1]})
    with pytest.raises(tritonserver.UnsupportedError, match="'gpu': GPU memory is not supported"):
        plus_one.infer(inputs={"INPUT": _rows(1)}, output_memory_type="gpu")
    with pytest.raises(tritonserver.InvalidArgumentError, match="memory type 'somewhere'"):
        plus_one.infer(inputs={"INPUT": _rows(1)}, output_memory_type="somewhere")

    with pytest.raises(tritonserver.InternalError, match="negative input is not allowed"):
        list(server.model("picky").infer(inputs={"INPUT": -_rows(1) - 1}))
    (failed,) = server.model("picky").infer(inputs={"INPUT": -_rows(1) - 1}, raise_on_error=False)
    assert isinstance(failed.error, tritonserver.TritonError) and failed.final

    class OnGpu:  # what cupy and CUDA torch tensors say of their memory
        def __dlpack_device__(self) -> tuple[int, int]:
            return 2, 0

    with pytest.raises(tritonserver.UnsupportedError, match="OnGpu on DLPack device 2"):
        tritonserver.Tensor.from_dlpack(OnGpu())
    with pytest.raises(tritonserver.InvalidArgumentError, match="has data type FP32, not BYTES"):
        tritonserver.Tensor.from_dlpack(np.ones(2, np.float32)).to_string_array()
    # the server still serves
    (response,) = plus_one.infer(inputs={"INPUT": _rows(1)})
    np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT"]), _rows(1) + 1)


def test_a_server_out_of_its_lifetime_or_with_bad_options_says_so(repository, tmp_path):
    with pytest.raises(tritonserver.InvalidArgumentError, match="Server not started"):
        tritonserver.Server(model_repository=str(repository)).ready()
    with pytest.raises(TypeError, match="option server_id: expected str, got int 1"):
        tritonserver.Server(model_repository=str(repository), server_id=1).start()
    with pytest.raises(tritonserver.InvalidArgumentError, match="no model repository given"):
        tritonserver.Server(model_repository=None).start()
    with pytest.raises(tritonserver.InternalError, match="nowhere is not a folder"):
        tritonserver.Server(model_repository=str(tmp_path / "nowhere")).start()
    with pytest.raises(tritonserver.UnsupportedError, match="option rate_limiter_mode"):
        tritonserver.Server(
            model_repository=str(repository),
            rate_limiter_mode=tritonserver.RateLimitMode.EXEC_COUNT,
        ).start()

    log = tmp_path / "server.log"
    server = tritonserver.Server(
        model_repository=str(repository),
        model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
        startup_models=["plus_one"],
        log_file=str(log),
        log_info=True,
        server_id="in-process",
    ).start(wait_until_ready=True)
    assert server.metadata()["name"] == "in-process"
    with pytest.raises(tritonserver.InvalidArgumentError, match="Server already started"):
        server.start()
    server.stop()
    assert not server.live() and "plus_one" in log.read_text()
    assert str(log) not in _log_files()
    with pytest.raises(tritonserver.InvalidArgumentError, match="this server has stopped"):
        server.ready()

    dropped = tritonserver.Server(
        model_repository=str(repository), log_file=str(log), log_info=True
    )
    dropped.start(wait_until_ready=True)
    assert str(log) in _log_files()
    del dropped  # never stopped: its log file closes with it (Triton's tests drop servers)
    gc.collect()
    assert str(log) not in _log_files()


def _log_files() -> list[str]:
    handlers = logging.getLogger("reposerve").handlers
    return [
        handler.baseFilename for handler in handlers if isinstance(handler, logging.FileHandler)
    ]


def _example() -> str:
    page = (ROOT / "docs" / "embedded.md").read_text()
    section = page[page.index("## Triton's in-process API") :]
    return re.findall(r"```python\n(.*?)```", section, re.S)[0]


def test_the_docs_triton_example_is_tritons_code_with_one_import_changed():
    example = _example()
    triton = "import tritonserver"
    ours = "import reposerve.tritonserver as tritonserver"
    assert example.count(ours) == 1 and "reposerve" not in example.replace(ours, triton)
    done = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("add_sub True [[ 1  2  3")
