"""onnxruntime provider options from [parameters]: defaults, strings, errors, engine cache."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from reposerve.backends.onnx_options import engine_cache_path, gpu_providers
from reposerve.config.onnx_options import CudaOptions, onnx_parameters
from reposerve.errors import ConfigError

pytestmark = pytest.mark.unit

ENGINES = Path("/cache/onnxruntime/m/1/0123456789abcdef/tensorrt-ort1.0")


def _providers(toml: str = "", precision: str = "fp32", gpu: int = 0):
    parameters = tomllib.loads(toml).get("parameters", {})
    return gpu_providers(onnx_parameters(parameters, "m/config.toml"), precision, gpu, ENGINES)


def _error(toml: str) -> str:
    with pytest.raises(ConfigError) as caught:
        onnx_parameters(tomllib.loads(toml)["parameters"], "m/config.toml")
    return caught.value.message


def test_cuda_by_default_with_the_options_reposerve_pins():
    assert _providers(gpu=3) == [
        (
            "CUDAExecutionProvider",
            {"device_id": "3", "cudnn_conv_algo_search": "EXHAUSTIVE", "use_tf32": "0"},
        ),
        ("CPUExecutionProvider", {}),
    ]


def test_cuda_options_pass_through_as_strings():
    (name, options), _ = _providers("""
        [parameters.onnxruntime.cuda]
        cudnn_conv_algo_search = "HEURISTIC"
        gpu_mem_limit = 8_000_000_000
        arena_extend_strategy = "kSameAsRequested"
        do_copy_in_default_stream = false
        use_tf32 = true
        tunable_op_max_tuning_duration_ms = 50
    """)
    assert name == "CUDAExecutionProvider"
    assert options == {
        "device_id": "0",
        "cudnn_conv_algo_search": "HEURISTIC",
        "use_tf32": "1",
        "gpu_mem_limit": "8000000000",
        "arena_extend_strategy": "kSameAsRequested",
        "do_copy_in_default_stream": "0",
        "tunable_op_max_tuning_duration_ms": "50",
    }


TENSORRT_DEFAULTS = {
    "device_id": "0",
    "trt_engine_cache_path": str(ENGINES),
    "trt_timing_cache_path": str(ENGINES),
    "trt_fp16_enable": "0",
    "trt_engine_cache_enable": "1",
    "trt_timing_cache_enable": "1",
    "trt_int8_enable": "0",
}


def test_tensorrt_true_puts_tensorrt_first_with_engines_cached_per_version():
    providers = _providers("[parameters]\ntensorrt = true")
    assert [name for name, _ in providers] == [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert providers[0][1] == TENSORRT_DEFAULTS
    assert engine_cache_path(providers) == ENGINES


def test_a_tensorrt_table_implies_tensorrt_and_fp16_follows_precision():
    providers = _providers("[parameters.onnxruntime.tensorrt]", precision="fp16")
    assert providers[0] == (
        "TensorrtExecutionProvider",
        TENSORRT_DEFAULTS | {"trt_fp16_enable": "1"},
    )


def test_tensorrt_overrides_and_profiles():
    (_, options), *_ = _providers("""
        [parameters.onnxruntime.tensorrt]
        trt_engine_cache_path = "/engines"
        trt_fp16_enable = true
        trt_max_workspace_size = 4_000_000_000
        trt_op_types_to_exclude = ["NonMaxSuppression", "TopK"]
        trt_profile_min_shapes = { x = [1, 4], mask = [1, 1] }
        trt_profile_opt_shapes = { x = [8, 4], mask = [8, 16] }
        trt_profile_max_shapes = { x = [32, 4], mask = [32, 64] }
    """)
    assert options["trt_engine_cache_path"] == "/engines"
    assert options["trt_timing_cache_path"] == str(ENGINES)
    assert options["trt_fp16_enable"] == "1"
    assert options["trt_max_workspace_size"] == "4000000000"
    assert options["trt_op_types_to_exclude"] == "NonMaxSuppression,TopK"
    assert options["trt_profile_min_shapes"] == "x:1x4,mask:1x1"
    assert options["trt_profile_opt_shapes"] == "x:8x4,mask:8x16"
    assert options["trt_profile_max_shapes"] == "x:32x4,mask:32x64"


def test_no_engine_cache_when_turned_off():
    providers = _providers("[parameters.onnxruntime.tensorrt]\ntrt_engine_cache_enable = false")
    assert providers[0][1]["trt_engine_cache_enable"] == "0"
    assert engine_cache_path(providers) is None
    assert engine_cache_path(_providers()) is None


def test_an_unknown_option_names_the_key_and_the_allowed_ones():
    allowed = ", ".join(CudaOptions.__struct_fields__)
    assert _error("[parameters.onnxruntime.cuda]\ncudnn_conv_algo_serch = 'HEURISTIC'") == (
        "m/config.toml: parameters.onnxruntime.cuda.cudnn_conv_algo_serch: unknown key "
        f"(allowed: {allowed})"
    )
    assert _error("[parameters.onnxruntime.rocm]") == (
        "m/config.toml: parameters.onnxruntime.rocm: unknown key (allowed: cuda, tensorrt)"
    )
    # The device is placement's: an instance sees only its own GPU.
    assert "tensorrt.device_id: unknown key" in _error(
        "[parameters.onnxruntime.tensorrt]\ndevice_id = 1"
    )


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[parameters.onnxruntime.cuda]\ngpu_mem_limit = '8GB'",
            "parameters.onnxruntime.cuda.gpu_mem_limit: expected int, got str",
        ),
        (
            "[parameters.onnxruntime.cuda]\ngpu_mem_limit = 0",
            "parameters.onnxruntime.cuda.gpu_mem_limit: expected int >= 1, got 0",
        ),
        (
            "[parameters.onnxruntime.cuda]\ncudnn_conv_algo_search = 'FAST'",
            "parameters.onnxruntime.cuda.cudnn_conv_algo_search: invalid enum value 'FAST'",
        ),
        (
            "[parameters.onnxruntime.tensorrt]\ntrt_fp16_enable = 1",
            "parameters.onnxruntime.tensorrt.trt_fp16_enable: expected bool, got int",
        ),
        (
            "[parameters.onnxruntime]\ncuda = 'fast'",
            "parameters.onnxruntime.cuda: expected object, got str",
        ),
        ("[parameters]\ntensorrt = 'yes'", "parameters.tensorrt: expected bool, got str"),
        (
            "[parameters]\ntensorrt = false\n[parameters.onnxruntime.tensorrt]",
            "parameters.onnxruntime.tensorrt: TensorRT options given while "
            "parameters.tensorrt = false. Hint: remove one of them",
        ),
    ],
)
def test_wrong_values_name_the_key(toml, message):
    assert _error(toml) == f"m/config.toml: {message}"


@pytest.mark.parametrize(
    ("profiles", "message"),
    [
        (
            "trt_profile_min_shapes = { x = [1, 4] }",
            "trt_profile_min_shapes: needs trt_profile_opt_shapes, trt_profile_max_shapes too "
            "(TensorRT takes the three together)",
        ),
        (
            "trt_profile_min_shapes = { x = [1, 4] }\n"
            "trt_profile_opt_shapes = { y = [8, 4] }\n"
            "trt_profile_max_shapes = { x = [32, 4] }",
            "trt_profile_opt_shapes: names ['y'], trt_profile_min_shapes ['x']",
        ),
        (
            "trt_profile_min_shapes = { x = [1, 4] }\n"
            "trt_profile_opt_shapes = { x = [8] }\n"
            "trt_profile_max_shapes = { x = [32, 4] }",
            "trt_profile_*_shapes.x: the three shapes differ in rank",
        ),
        (
            "trt_profile_min_shapes = { x = [1, 4] }\n"
            "trt_profile_opt_shapes = { x = [64, 4] }\n"
            "trt_profile_max_shapes = { x = [32, 4] }",
            "trt_profile_*_shapes.x: expected min <= opt <= max in every dimension, "
            "got [1, 4], [64, 4], [32, 4]",
        ),
    ],
)
def test_profiles_are_checked_together(profiles, message):
    toml = f"[parameters.onnxruntime.tensorrt]\n{profiles}"
    assert _error(toml) == f"m/config.toml: parameters.onnxruntime.tensorrt.{message}"


def test_other_parameters_are_left_to_their_owners():
    parameters = onnx_parameters(
        {"intra_op_threads": 4, "max_inflight_batches": 2}, "m/config.toml"
    )
    assert parameters.tensorrt is None
