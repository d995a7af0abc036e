"""The onnxruntime backend's options in a model's ``[parameters]``, as typed Structs.

```toml
[parameters]
tensorrt = true                          # TensorRT first, CUDA for what it cannot run
[parameters.onnxruntime.cuda]            # CUDAExecutionProvider options
cudnn_conv_algo_search = "HEURISTIC"
gpu_mem_limit = 8_000_000_000
[parameters.onnxruntime.tensorrt]        # TensorrtExecutionProvider options; implies tensorrt
trt_max_workspace_size = 4_000_000_000
trt_profile_min_shapes = { x = [1, 4] }  # full shapes (batch axis included), per input
trt_profile_opt_shapes = { x = [8, 4] }
trt_profile_max_shapes = { x = [32, 4] }
```
Keys are onnxruntime's own provider option names with TOML types (bool, int, string, a
table of shapes), checked when the config is read (``reposerve check`` and a load alike),
for CPU instances too, so a typo fails before any process starts instead of being ignored.
``device_id`` is not among them: placement owns the device. Imports no onnxruntime:
``reposerve.backends.onnx_options`` turns the checked values into provider lists, and
whether a provider exists at run time is the backend's to find out.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from reposerve.config.tables import convert_table
from reposerve.errors import ConfigError

Shapes = dict[str, list[Annotated[int, Meta(ge=0)]]]


# Subclasses repeat ``frozen=True``: msgspec inherits it, but a type checker reads each
# class's own keywords only (PEP 681's dataclass_transform).
class _Options(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class CudaOptions(_Options, frozen=True):
    """CUDAExecutionProvider options. Unset ones keep onnxruntime's defaults; the two
    pinned here say what reposerve promises whatever onnxruntime's release defaults."""

    # onnxruntime's own default: the best convolution kernels, searched once per shape.
    cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = "EXHAUSTIVE"
    # precision = "fp32" means fp32: TF32 matmuls and convolutions are asked for, not given.
    use_tf32: bool = False
    gpu_mem_limit: Annotated[int, Meta(ge=1)] | UnsetType = UNSET  # bytes for the arena
    arena_extend_strategy: Literal["kNextPowerOfTwo", "kSameAsRequested"] | UnsetType = UNSET
    do_copy_in_default_stream: bool | UnsetType = UNSET
    cudnn_conv_use_max_workspace: bool | UnsetType = UNSET
    cudnn_conv1d_pad_to_nc1d: bool | UnsetType = UNSET
    enable_cuda_graph: bool | UnsetType = UNSET
    enable_skip_layer_norm_strict_mode: bool | UnsetType = UNSET
    prefer_nhwc: bool | UnsetType = UNSET
    use_ep_level_unified_stream: bool | UnsetType = UNSET
    tunable_op_enable: bool | UnsetType = UNSET
    tunable_op_tuning_enable: bool | UnsetType = UNSET
    tunable_op_max_tuning_duration_ms: Annotated[int, Meta(ge=0)] | UnsetType = UNSET


class TensorrtOptions(_Options, frozen=True):
    """TensorrtExecutionProvider options. Engines and the timing cache are kept on disk by
    default (a restart loads engines instead of spending minutes building them again);
    their folder defaults to one per model version content, see ``gpu_providers``."""

    trt_engine_cache_enable: bool = True
    trt_engine_cache_path: str | UnsetType = UNSET
    trt_engine_cache_prefix: str | UnsetType = UNSET
    trt_timing_cache_enable: bool = True
    trt_timing_cache_path: str | UnsetType = UNSET
    trt_fp16_enable: bool | UnsetType = UNSET  # default: on when precision = "fp16"
    trt_bf16_enable: bool | UnsetType = UNSET
    # INT8 needs a calibration table made for the model: never on unless asked.
    trt_int8_enable: bool = False
    trt_int8_calibration_table_name: str | UnsetType = UNSET
    trt_int8_use_native_calibration_table: bool | UnsetType = UNSET
    trt_max_workspace_size: Annotated[int, Meta(ge=1)] | UnsetType = UNSET  # bytes
    trt_builder_optimization_level: Annotated[int, Meta(ge=0, le=5)] | UnsetType = UNSET
    trt_min_subgraph_size: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    trt_max_partition_iterations: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    trt_auxiliary_streams: Annotated[int, Meta(ge=-1)] | UnsetType = UNSET
    trt_cuda_graph_enable: bool | UnsetType = UNSET
    trt_context_memory_sharing_enable: bool | UnsetType = UNSET
    trt_layer_norm_fp32_fallback: bool | UnsetType = UNSET
    trt_sparsity_enable: bool | UnsetType = UNSET
    trt_build_heuristics_enable: bool | UnsetType = UNSET
    trt_force_sequential_engine_build: bool | UnsetType = UNSET
    trt_engine_hw_compatible: bool | UnsetType = UNSET
    trt_detailed_build_log: bool | UnsetType = UNSET
    trt_dump_subgraphs: bool | UnsetType = UNSET
    trt_op_types_to_exclude: list[str] | UnsetType = UNSET
    trt_profile_min_shapes: Shapes | UnsetType = UNSET
    trt_profile_opt_shapes: Shapes | UnsetType = UNSET
    trt_profile_max_shapes: Shapes | UnsetType = UNSET


class OnnxRuntimeTable(_Options, frozen=True):
    """``[parameters.onnxruntime]``: one table per execution provider."""

    cuda: dict[str, Any] = {}
    tensorrt: dict[str, Any] | UnsetType = UNSET


class OnnxParameters(_Options, frozen=True):
    """What the onnxruntime backend reads from ``[parameters]``, validated."""

    cuda: CudaOptions = CudaOptions()
    tensorrt: TensorrtOptions | None = None  # None: CUDA only


PROFILE_KEYS = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")


# TensorRT options that name files or folders the server writes (engines, caches) or reads.
FILE_OPTIONS = frozenset(
    {
        "trt_engine_cache_path",
        "trt_engine_cache_prefix",
        "trt_timing_cache_path",
        "trt_int8_calibration_table_name",
    }
)


def file_options(parameters: dict[str, Any]) -> list[str]:
    """The ``parameters.onnxruntime.tensorrt`` keys in ``parameters`` that name paths."""
    table = parameters.get("onnxruntime")
    tensorrt = table.get("tensorrt") if isinstance(table, dict) else None
    if not isinstance(tensorrt, dict):
        return []
    return [f"parameters.onnxruntime.tensorrt.{key}" for key in tensorrt if key in FILE_OPTIONS]


def onnx_parameters(parameters: dict[str, Any], label: str) -> OnnxParameters:
    """Validate the backend's part of ``[parameters]``; errors name the file (``label``),
    the key and the allowed names. Other keys of ``[parameters]`` belong to others and are
    left alone."""
    table = convert_table(
        parameters.get("onnxruntime", {}), OnnxRuntimeTable, label, "parameters.onnxruntime"
    )
    cuda = convert_table(table.cuda, CudaOptions, label, "parameters.onnxruntime.cuda")
    switch = parameters.get("tensorrt", UNSET)
    if switch is not UNSET and not isinstance(switch, bool):
        raise ConfigError(
            f"{label}: parameters.tensorrt: expected bool, got {type(switch).__name__}"
        )
    if table.tensorrt is UNSET:
        return OnnxParameters(cuda=cuda, tensorrt=TensorrtOptions() if switch is True else None)
    if switch is False:
        raise ConfigError(
            f"{label}: parameters.onnxruntime.tensorrt: TensorRT options given while "
            "parameters.tensorrt = false. Hint: remove one of them"
        )
    key = "parameters.onnxruntime.tensorrt"
    tensorrt = convert_table(table.tensorrt, TensorrtOptions, label, key)
    problem = _profile_problem(tensorrt)
    if problem:
        raise ConfigError(f"{label}: {key}.{problem}")
    return OnnxParameters(cuda=cuda, tensorrt=tensorrt)


def _profile_problem(options: TensorrtOptions) -> str | None:
    """TensorRT needs all three profiles, naming the same inputs, with min <= opt <= max."""
    profiles = [getattr(options, key) for key in PROFILE_KEYS]
    given = [key for key, shapes in zip(PROFILE_KEYS, profiles, strict=True) if shapes]
    if not given:
        return None
    if len(given) < len(PROFILE_KEYS):
        missing = ", ".join(key for key in PROFILE_KEYS if key not in given)
        return f"{given[0]}: needs {missing} too (TensorRT takes the three together)"
    low, opt, high = profiles
    for key, shapes in zip(PROFILE_KEYS[1:], (opt, high), strict=True):
        if shapes.keys() != low.keys():
            return f"{key}: names {sorted(shapes)}, trt_profile_min_shapes {sorted(low)}"
    for name, minimum in low.items():
        if not len(minimum) == len(opt[name]) == len(high[name]):
            return f"trt_profile_*_shapes.{name}: the three shapes differ in rank"
        if not all(a <= b <= c for a, b, c in zip(minimum, opt[name], high[name], strict=True)):
            return (
                f"trt_profile_*_shapes.{name}: expected min <= opt <= max in every dimension, "
                f"got {minimum}, {opt[name]}, {high[name]}"
            )
    return None
