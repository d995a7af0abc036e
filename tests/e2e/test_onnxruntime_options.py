"""The onnxruntime backend's [parameters] and its on-disk cache, through a real server:
fp16 graphs converted once per version, bad provider options failing the load by name."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.server import SERVE_BROKEN, running_server
from tests.toy_models import write_model

model_files = pytest.importorskip("tests.model_files", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

pytestmark = pytest.mark.e2e

FP16_TWICE = """
    max_batch_size = 8
    [optimization]
    precision = "fp16"
    [[instance_group]]
    count = 2
"""


def _infer(server, model: str, values: np.ndarray) -> np.ndarray:
    body = {
        "inputs": [
            {
                "name": "x",
                "shape": list(values.shape),
                "datatype": "FP32",
                "data": values.ravel().tolist(),
            }
        ]
    }
    reply = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    output = reply.json()["outputs"][0]
    return np.array(output["data"], np.float32).reshape(output["shape"])


def _fp16_model(repository) -> None:
    write_model(repository, "half", FP16_TWICE, None)
    model_files.export_onnx(repository / "half" / "1" / "model.onnx")


def test_fp16_is_converted_once_per_version_and_kept(repository, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("REPOSERVE_CACHE_DIR", str(cache))
    _fp16_model(repository)
    values = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    with running_server(repository, tmp_path) as server:
        converted = list(cache.glob("onnxruntime/half/1/*/*.onnx"))
        assert [path.name for path in converted] == ["model.fp16-keep-io-types.onnx"]
        first = converted[0].stat()
        np.testing.assert_allclose(
            _infer(server, "half", values), model_files.reference(values), atol=2e-2
        )
        # Two new instances on reload: both load the kept file, neither converts again.
        reply = httpx.post(f"{server.url}/v2/repository/models/half/load", timeout=60)
        assert reply.status_code == 200, reply.text
        again = converted[0].stat()
        assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
        assert list(cache.glob("onnxruntime/half/1/*/*.onnx")) == converted
        assert not list(cache.rglob(".*"))  # no temporary file left behind
        np.testing.assert_allclose(
            _infer(server, "half", values), model_files.reference(values), atol=2e-2
        )


def test_an_unwritable_cache_converts_in_each_instance(repository, tmp_path, monkeypatch):
    monkeypatch.setenv("REPOSERVE_CACHE_DIR", "/dev/null/cache")  # never a folder, even as root
    _fp16_model(repository)
    with running_server(repository, tmp_path) as server:
        values = np.ones((2, 4), np.float32)
        np.testing.assert_allclose(
            _infer(server, "half", values), model_files.reference(values), atol=2e-2
        )
        assert server.log().count("cannot keep the fp16 graph in /dev/null/cache/") == 2


def test_bad_provider_options_fail_the_load_naming_the_key(repository, tmp_path):
    bad = {
        "typo": '[parameters.onnxruntime.cuda]\ncudnn_conv_algo_serch = "HEURISTIC"',
        "wrong_type": '[parameters.onnxruntime.tensorrt]\ntrt_fp16_enable = "yes"',
    }
    for name, parameters in bad.items():
        write_model(repository, name, f"max_batch_size = 8\n{parameters}\n", None)
        model_files.export_onnx(repository / name / "1" / "model.onnx")
    with running_server(repository, tmp_path, *SERVE_BROKEN) as server:
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        reasons = {entry["name"]: entry["reason"] for entry in index}
        # Refused as the config is read, before any instance starts (as `reposerve check`).
        assert reasons["typo"].startswith(
            "typo/config.toml: "
            "parameters.onnxruntime.cuda.cudnn_conv_algo_serch: unknown key (allowed: "
            "cudnn_conv_algo_search, use_tf32, gpu_mem_limit, "
        )
        assert reasons["wrong_type"] == (
            "wrong_type/config.toml: "
            "parameters.onnxruntime.tensorrt.trt_fp16_enable: expected bool, got str"
        )
