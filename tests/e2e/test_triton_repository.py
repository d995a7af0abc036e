"""A repository laid out for Triton (config.pbtxt, platform names, libtorch's INPUT__0
naming, a python-backend TritonPythonModel) served as it is: results equal direct runs,
requests are batched, and `reposerve convert` turns a config.pbtxt into config.toml."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.probes import stats
from tests.server import REPO_ROOT, start_server
from tests.triton_models import ADD_SUB, write_triton_model

model_files = pytest.importorskip("tests.model_files", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

pytestmark = pytest.mark.e2e

ONNX = """
    name: "tiny_onnx"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
    dynamic_batching { max_queue_delay_microseconds: 20000 }
"""
LIBTORCH = """
    name: "tiny_libtorch"
    platform: "pytorch_libtorch"
    max_batch_size: 8
    input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
    dynamic_batching { }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton_repository")
    for name, config, export, file in (
        ("tiny_onnx", ONNX, model_files.export_onnx, "model.onnx"),
        ("tiny_libtorch", LIBTORCH, model_files.export_torchscript, "model.pt"),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
        export(root / name / "1" / file)
    # Triton's python-backend add_sub example, its TritonPythonModel as Triton documents it.
    batching = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 20000 }"
    write_triton_model(root, "add_sub", ADD_SUB, batching)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    server.root = root
    yield server
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize(("model", "input_name", "output_name"), [
    ("tiny_onnx", "x", "y"),
    ("tiny_libtorch", "INPUT__0", "OUTPUT__0"),
])  # fmt: skip
def test_results_equal_a_direct_run_and_requests_are_batched(
    server, model, input_name, output_name
):
    rows = np.random.default_rng(7).standard_normal((16, 1, 4)).astype(np.float32)

    def infer(row: np.ndarray) -> np.ndarray:
        client = httpclient.InferenceServerClient(server.address)
        tensor = httpclient.InferInput(input_name, [1, 4], "FP32")
        tensor.set_data_from_numpy(row)
        result = client.infer(model, [tensor]).as_numpy(output_name)
        client.close()
        return result

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(infer, rows))
    for row, result in zip(rows, results, strict=True):
        np.testing.assert_allclose(result, model_files.reference(row), rtol=1e-5, atol=1e-5)
    served = stats(server, model)
    assert served["inference_count"] == 16
    assert served["execution_count"] < 16  # requests shared batches


def test_the_python_backend_model_adds_and_subtracts_in_shared_batches(server):
    pairs = np.random.default_rng(8).standard_normal((12, 2, 1, 4)).astype(np.float32)

    def infer(pair: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        client = httpclient.InferenceServerClient(server.address)
        tensors = [httpclient.InferInput(f"INPUT{i}", [1, 4], "FP32") for i in (0, 1)]
        for tensor, values in zip(tensors, pair, strict=True):
            tensor.set_data_from_numpy(values)
        result = client.infer("add_sub", tensors)
        client.close()
        return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(infer, pairs))
    for (first, second), (total, difference) in zip(pairs, results, strict=True):
        np.testing.assert_allclose(total, first + second, rtol=1e-6)
        np.testing.assert_allclose(difference, first - second, rtol=1e-6)
    served = stats(server, "add_sub")
    assert served["inference_count"] == 12 and served["execution_count"] < 12


def test_the_config_document_shows_the_pbtxt_settings(server):
    document = httpx.get(f"{server.url}/v2/models/tiny_libtorch/config").json()
    assert document["platform"] == "pytorch_libtorch"
    assert [tensor["name"] for tensor in document["input"]] == ["INPUT__0"]
    assert document["max_batch_size"] == 8


def test_convert_prints_and_writes_the_equivalent_config_toml(server, tmp_path):
    folder = server.root / "tiny_onnx"

    def convert(*flags: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "reposerve", "convert", str(folder), *flags]
        return subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)

    printed = convert()
    assert printed.returncode == 0, printed.stderr
    assert 'backend = "onnxruntime"' in printed.stdout
    assert "[dynamic_batching]\nmax_queue_delay_microseconds = 20000" in printed.stdout
    written = convert("--write")
    assert written.returncode == 0, written.stderr
    assert (folder / "config.toml").read_text() == printed.stdout
    again = convert("--write")
    assert again.returncode == 1 and "exists; not overwritten" in again.stderr
    check = subprocess.run(
        [sys.executable, "-m", "reposerve", "check", str(server.root)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    assert "ok   tiny_onnx (versions 1; onnxruntime)" in check.stdout


def test_a_pbtxt_field_without_equivalent_fails_that_model_naming_the_field(tmp_path):
    root = tmp_path / "repository"
    (root / "seq" / "1").mkdir(parents=True)
    (root / "seq" / "1" / "model.py").write_text("class Model:\n    pass\n")
    (root / "seq" / "config.pbtxt").write_text(
        'backend: "python"\nresponse_cache { enable: true }\n'
    )
    check = subprocess.run(
        [sys.executable, "-m", "reposerve", "check", str(root)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    assert check.returncode == 1
    assert "FAIL seq/config.pbtxt: 2:1: response_cache: not supported by reposerve" in (
        check.stdout
    )
