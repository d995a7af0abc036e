"""onnxruntime execution providers from a model's checked ``[parameters]``.

The options themselves (``[parameters.onnxruntime.cuda]``, ``.tensorrt``, ``tensorrt =
true``) and their rules live in ``reposerve.config.onnx_options``, applied when the config
is read; this module trusts them. ``gpu_providers`` turns them into the
``(name, {option: string})`` list onnxruntime takes.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from msgspec import UNSET

from reposerve.config.onnx_options import OnnxParameters

Provider = tuple[str, dict[str, str]]
CPU_PROVIDER: Provider = ("CPUExecutionProvider", {})


def gpu_providers(
    parameters: OnnxParameters, precision: str, gpu: int, engine_cache: Path
) -> list[Provider]:
    """The providers of a GPU instance on CUDA device ``gpu`` (as its process sees it), in
    onnxruntime's order of preference, with every option as a string.

    ``engine_cache`` is where TensorRT engines and its timing cache go unless the config
    names a path: one folder per model version content, so another version (or the same
    number with a new file) never loads a stale engine; onnxruntime's engine names hash the
    graph's structure, not its weights.
    """
    device = {"device_id": str(gpu)}
    cuda = ("CUDAExecutionProvider", device | _strings(parameters.cuda))
    if parameters.tensorrt is None:
        return [cuda, CPU_PROVIDER]
    tensorrt = parameters.tensorrt
    defaults = {
        "trt_engine_cache_path": str(engine_cache),
        "trt_timing_cache_path": str(engine_cache),
        "trt_fp16_enable": _string(precision == "fp16"),
    }
    return [
        ("TensorrtExecutionProvider", device | defaults | _strings(tensorrt)),
        cuda,
        CPU_PROVIDER,
    ]


def engine_cache_path(providers: list[Provider]) -> Path | None:
    """The folder TensorRT keeps engines in, when these providers keep engines at all."""
    for name, options in providers:
        if name == "TensorrtExecutionProvider" and options["trt_engine_cache_enable"] == "1":
            return Path(options["trt_engine_cache_path"])
    return None


def _strings(options: msgspec.Struct) -> dict[str, str]:
    return {
        key: _string(value)
        for key, value in msgspec.structs.asdict(options).items()
        if value is not UNSET
    }


def _string(value: object) -> str:
    """onnxruntime parses every option from a string: bools as 1/0, shapes as
    ``name:1x3x224x224,other:1x8``, lists comma-separated."""
    match value:
        case bool():
            return "1" if value else "0"
        case dict():
            return ",".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in value.items())
        case list():
            return ",".join(map(str, value))
        case _:
            return str(value)
