"""`reposerve check` refuses what a load refuses, in the same words: every rule on a
config's [parameters] and on what its backend supports, walked through both."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from reposerve.config.onnx_options import CudaOptions
from tests.server import REPO_ROOT, SERVE_BROKEN, running_server
from tests.toy_models import ASYNC_GATHER, PLUS_ONE, vector_config, write_model

model_files = pytest.importorskip("tests.model_files", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

pytestmark = pytest.mark.e2e

TORCHSCRIPT = """
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
TENSORRT = "[parameters.onnxruntime.tensorrt]"
# model -> (its file, its config, the message both refuse it with, after "NAME/config.toml: ")
RULES = {
    "onnx_bf16": (
        "onnx",
        'max_batch_size = 8\n[optimization]\nprecision = "bf16"',
        "optimization.precision: bf16 is not supported by the onnxruntime backend. "
        "Hint: use fp16 or fp32",
    ),
    "onnx_bf16_named": (
        "onnx",
        'backend = "onnxruntime"\nmax_batch_size = 8\n[optimization]\nprecision = "bf16"',
        "optimization.precision: bf16 is not supported by the onnxruntime backend. "
        "Hint: use fp16 or fp32",
    ),
    "cuda_typo": (
        "onnx",
        'max_batch_size = 8\n[parameters.onnxruntime.cuda]\ncudnn_conv_algo_serch = "HEURISTIC"',
        "parameters.onnxruntime.cuda.cudnn_conv_algo_serch: unknown key (allowed: "
        f"{', '.join(CudaOptions.__struct_fields__)})",
    ),
    "provider_typo": (
        "onnx",
        "max_batch_size = 8\n[parameters.onnxruntime.rocm]",
        "parameters.onnxruntime.rocm: unknown key (allowed: cuda, tensorrt)",
    ),
    "trt_wrong_type": (
        "onnx",
        f'max_batch_size = 8\n{TENSORRT}\ntrt_fp16_enable = "yes"',
        "parameters.onnxruntime.tensorrt.trt_fp16_enable: expected bool, got str",
    ),
    "trt_switch": (
        "onnx",
        'max_batch_size = 8\n[parameters]\ntensorrt = "yes"',
        "parameters.tensorrt: expected bool, got str",
    ),
    "trt_switched_off": (
        "onnx",
        f"max_batch_size = 8\n[parameters]\ntensorrt = false\n{TENSORRT}\ntrt_fp16_enable = true",
        "parameters.onnxruntime.tensorrt: TensorRT options given while parameters.tensorrt = "
        "false. Hint: remove one of them",
    ),
    "trt_profiles": (
        "onnx",
        f"max_batch_size = 8\n{TENSORRT}\ntrt_profile_min_shapes = {{ x = [1, 4] }}",
        "parameters.onnxruntime.tensorrt.trt_profile_min_shapes: needs "
        "trt_profile_opt_shapes, trt_profile_max_shapes too (TensorRT takes the three together)",
    ),
    "torch_tf32": (
        "torchscript",
        f'{TORCHSCRIPT}\n[parameters]\nallow_tf32 = "yes"',
        "parameters.allow_tf32: expected bool, got str",
    ),
    "torch_compile_key": (
        "torchscript",
        f"{TORCHSCRIPT}\n[parameters]\ntorch_compile = {{ fullgraph = true }}",
        "parameters.torch_compile.fullgraph: unknown key (allowed: mode, dynamic, backend)",
    ),
    "inflight": (
        ASYNC_GATHER,
        vector_config(extra="[parameters]\nmax_inflight_batches = 1.5"),
        "parameters.max_inflight_batches: expected int, got float",
    ),
    "staging": (
        PLUS_ONE,
        vector_config(extra='[parameters]\nstage_next_batch = "no"'),
        "parameters.stage_next_batch: expected bool, got str",
    ),
    "threads": (
        PLUS_ONE,
        vector_config(extra="[parameters]\nintra_op_threads = 0"),
        "parameters.intra_op_threads: expected int >= 1, got 0",
    ),
}


def _write(repository) -> None:
    for name, (file, config, _) in RULES.items():
        python = None if file in ("onnx", "torchscript") else file
        write_model(repository, name, config, python)
        if file == "onnx":
            model_files.export_onnx(repository / name / "1" / "model.onnx")
        elif file == "torchscript":
            model_files.export_torchscript(repository / name / "1" / "model.pt")


def test_check_and_load_refuse_the_same_configs_in_the_same_words(repository, tmp_path):
    _write(repository)
    expected = {name: f"{name}/config.toml: {message}" for name, (*_, message) in RULES.items()}
    result = subprocess.run(
        [sys.executable, "-m", "reposerve", "check", str(repository)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [f"FAIL {expected[name]}" for name in sorted(RULES)]
    with running_server(
        repository, tmp_path, "--model-control-mode=explicit", *SERVE_BROKEN
    ) as server:
        refused = {}
        for name in RULES:
            reply = httpx.post(f"{server.url}/v2/repository/models/{name}/load", timeout=120)
            assert reply.status_code == 400, reply.text
            refused[name] = reply.json()["error"]
        assert refused == expected
        # The index gives each the same reason.
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        assert {entry["name"]: entry.get("reason") for entry in index} == expected
