"""onnxruntime and torch backends: results equal a direct run of the same model, config
auto-complete and mismatch errors, precision, warmup; GPU paths skip without a GPU."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reposerve.repository.gpus import discover
from tests.server import SERVE_BROKEN, running_server, start_server
from tests.toy_models import vector_config, write_model

model_files = pytest.importorskip("tests.model_files", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

pytestmark = pytest.mark.e2e

TOLERANCE = model_files.TOLERANCE

DECLARED = """
    max_batch_size = 8
    [[input]]
    name = "INPUT"
    datatype = "FP32"
    shape = [4]
    [[output]]
    name = "OUTPUT"
    datatype = "FP32"
    shape = [3]
"""


def _config(body: str = "max_batch_size = 8", precision: str = "fp32", extra: str = "") -> str:
    return f'{body}\n[optimization]\nprecision = "{precision}"\n{extra}\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    for precision in ("fp32", "fp16"):
        write_model(root, f"onnx_{precision}", _config(precision=precision), None)
        model_files.export_onnx(root / f"onnx_{precision}" / "1" / "model.onnx")
    for precision in ("fp32", "fp16", "bf16"):
        write_model(root, f"pt2_{precision}", _config(precision=precision), None)
        model_files.export_program(root / f"pt2_{precision}" / "1" / "model.pt2")
    write_model(root, "pt2_bf16_io", _config(), None)
    model_files.export_bf16_program(root / "pt2_bf16_io" / "1" / "model.pt2")
    write_model(root, "script", _config(DECLARED), None)
    model_files.export_torchscript(root / "script" / "1" / "model.pt")
    write_model(root, "script_undeclared", _config(), None)
    model_files.export_torchscript(root / "script_undeclared" / "1" / "model.pt")
    write_model(root, "onnx_bf16", _config(precision="bf16"), None)
    model_files.export_onnx(root / "onnx_bf16" / "1" / "model.onnx")
    mismatch = DECLARED.replace('"INPUT"', '"x"').replace("shape = [4]", "shape = [5]")
    write_model(root, "onnx_mismatch", _config(mismatch), None)
    model_files.export_onnx(root / "onnx_mismatch" / "1" / "model.onnx")
    write_model(root, "onnx_unbatched", _config("max_batch_size = 0"), None)
    model_files.export_onnx(root / "onnx_unbatched" / "1" / "model.onnx")
    warm = _config(DECLARED, extra='[[warmup]]\nbatch_size = 4\ninputs = { INPUT = "random" }')
    write_model(root, "warm", warm, None)
    model_files.export_torchscript(root / "warm" / "1" / "model.pt")
    server = start_server(root, tmp_path_factory.mktemp("log"), *SERVE_BROKEN)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def client(server):
    client = httpclient.InferenceServerClient(server.address)
    yield client
    client.close()


def _run(client, model: str, values: np.ndarray, name: str = "x", output: str | None = None):
    tensor = httpclient.InferInput(name, list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    result = client.infer(model, [tensor])
    return result.as_numpy(output or result.get_response()["outputs"][0]["name"])


@pytest.mark.parametrize(
    ("model", "input_name", "precision"),
    [
        ("onnx_fp32", "x", "fp32"),
        ("onnx_fp16", "x", "fp16"),
        ("pt2_fp32", "x", "fp32"),
        ("pt2_fp16", "x", "fp16"),
        ("pt2_bf16", "x", "bf16"),
        ("script", "INPUT", "fp32"),
    ],
)
def test_results_equal_a_direct_run(client, model, input_name, precision):
    values = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    result = _run(client, model, values, input_name)
    assert result.dtype == np.float32  # client-visible datatypes never change
    np.testing.assert_allclose(
        result, model_files.reference(values), atol=TOLERANCE[precision], rtol=TOLERANCE[precision]
    )


def test_bf16_tensors_cross_the_boundary_both_ways(client):
    metadata = client.get_model_metadata("pt2_bf16_io")
    assert [t["datatype"] for t in metadata["inputs"] + metadata["outputs"]] == ["BF16", "BF16"]
    values = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    tensor = httpclient.InferInput("x", [5, 4], "BF16")
    tensor.set_data_from_numpy(values)  # sent as binary data: each float's upper 16 bits
    name = metadata["outputs"][0]["name"]
    output = httpclient.InferRequestedOutput(name, binary_data=True)
    result = client.infer("pt2_bf16_io", [tensor], outputs=[output])
    assert result.get_output(name)["datatype"] == "BF16"
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    expected = (model_files.reference_bf16(bits).astype(np.uint32) << 16).view(np.float32)
    # Within a bfloat16 step: another thread count may round an accumulation differently.
    np.testing.assert_allclose(result.as_numpy(name), expected, rtol=1e-2, atol=1e-2)


def test_inputs_and_outputs_are_filled_from_the_model_file(client):
    config = client.get_model_config("onnx_fp32")
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [4])
    ]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("y", [3])]
    metadata = client.get_model_metadata("pt2_fp32")
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert metadata["platform"] == "pytorch_libtorch"
    unbatched = client.get_model_metadata("onnx_unbatched")
    assert unbatched["inputs"][0]["shape"] == [-1, 4]  # the file's own batch axis, as a dim
    values = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(
        _run(client, "onnx_unbatched", values), model_files.reference(values), atol=1e-5
    )


def _reason(server, model: str) -> str:
    index = httpx.post(f"{server.url}/v2/repository/index").json()
    entry = next(e for e in index if e["name"] == model)
    assert entry["state"] == "UNAVAILABLE"
    return entry["reason"]


def test_config_that_disagrees_with_the_file_is_a_load_error(server):
    assert _reason(server, "onnx_mismatch") == (
        "model 'onnx_mismatch' version 1 instance 0 (cpu): load failed: "
        "onnx_mismatch/config.toml: input 'x': declared shape [5], "
        "the model file says [4] (per item, batch dimension excluded)"
    )


def test_torchscript_must_declare_its_tensors(server):
    assert "TorchScript files carry no tensor names or shapes" in _reason(
        server, "script_undeclared"
    )


def test_onnx_bf16_is_refused_clearly(server):
    assert _reason(server, "onnx_bf16") == (
        "onnx_bf16/config.toml: optimization.precision: bf16 is not supported by the "
        "onnxruntime backend. Hint: use fp16 or fp32"
    )


def test_warmup_runs_before_ready(server):
    stats = httpx.get(f"{server.url}/v2/models/warm/stats").json()["model_stats"][0]
    assert stats["execution_count"] == 1
    assert stats["batch_stats"][0]["batch_size"] == 4


def test_wrong_input_is_rejected_before_the_model(client):
    with pytest.raises(InferenceServerException, match=r"expected shape \[-1, 4\], got \[1, 5\]"):
        _run(client, "onnx_fp32", np.ones((1, 5), np.float32))


@pytest.mark.gpu
def test_gpu_instances_run_on_the_gpu(repository, tmp_path):
    devices = discover().visible
    if not devices:
        pytest.skip("no GPU visible (the GPU probe found none)")
    group = '[[instance_group]]\nkind = "gpu"\ncount = 2'
    write_model(repository, "onnx_gpu", _config(extra=group), None)
    model_files.export_onnx(repository / "onnx_gpu" / "1" / "model.onnx")
    for precision in ("fp16", "bf16"):
        write_model(
            repository, f"pt2_gpu_{precision}", _config(precision=precision, extra=group), None
        )
        model_files.export_program(repository / f"pt2_gpu_{precision}" / "1" / "model.pt2")
    where = write_model(
        repository, "where", vector_config(size=1, output=("INT64", 1), extra=group), WHERE
    )
    with running_server(repository, tmp_path) as server:
        client = httpclient.InferenceServerClient(server.address)
        values = np.ones((2, 4), np.float32)
        for model in ("onnx_gpu", "pt2_gpu_fp16", "pt2_gpu_bf16"):
            tolerance = TOLERANCE[model.rsplit("_", 1)[-1]] if "pt2" in model else 1e-4
            np.testing.assert_allclose(
                _run(client, model, values), model_files.reference(values), atol=tolerance
            )
        client.close()
        # Two instances on each GPU, each process seeing only its own device (by UUID).
        loaded = [line.split() for line in (where / "1" / "LOADED").read_text().splitlines()]
        assert sorted(uuid for _, uuid in loaded) == sorted(d.uuid for d in devices) * 2
        assert len({pid for pid, _ in loaded}) == 2 * len(devices)


# Appends "pid CUDA_VISIBLE_DEVICES" to LOADED beside model.py; torch must see one device.
WHERE = """
    import os
    import numpy as np
    import torch

    class Model:
        def load(self, context):
            assert context.device == "cuda:0" and torch.cuda.device_count() == 1
            with open(context.version_path / "LOADED", "a") as log:
                log.write(f"{os.getpid()} {os.environ['CUDA_VISIBLE_DEVICES']}\\n")

        def execute(self, inputs):
            return {"OUTPUT": np.full((len(inputs["INPUT"]), 1), os.getpid(), np.int64)}
"""


def test_python_models_are_untouched_by_auto_complete(repository, tmp_path):
    write_model(
        repository,
        "py",
        vector_config(size=4),
        "class Model:\n    def execute(self, i):\n        return {'OUTPUT': i['INPUT']}\n",
    )
    with running_server(repository, tmp_path) as server:
        config = httpx.get(f"{server.url}/v2/models/py/config").json()
        assert [t["name"] for t in config["input"]] == ["INPUT"]
