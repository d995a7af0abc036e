"""The documents of the V2 protocol and Triton's extensions, other than inference: server
metadata, model metadata and the model configuration in Triton's model-config JSON, as
the service's results (``reposerve.operations``).

Shapes follow Triton so its clients and tools (tritonclient, perf_analyzer) read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

import reposerve
from reposerve.config import ModelConfig, TensorConfig
from reposerve.config.triton_json import to_triton_parameters
from reposerve.datatypes import TRITON_CONFIG_TYPES
from reposerve.operations import (
    ModelConfigDocument,
    ModelMetadata,
    ServerMetadata,
    TensorMetadata,
)

# Triton's name by default: its clients and scripts check it (--server-name changes it);
# reposerve's own identity is the version and the extensions it lists.
SERVER_NAME = "triton"
EXTENSIONS = (
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "schedule_policy",
    "statistics",
    "parameters",
)
PLATFORMS = {
    "python": "python",
    "onnxruntime": "onnxruntime_onnx",
    "torch": "pytorch_libtorch",
    "ensemble": "ensemble",
}
TRITON_BACKENDS = {
    "python": "python",
    "onnxruntime": "onnxruntime",
    "torch": "pytorch",
    "ensemble": "",
}

_encoder = msgspec.json.Encoder()


def encode(document: Any) -> bytes:
    """A document (a Struct or builtins) as its V2 JSON."""
    return _encoder.encode(document)


def server_metadata(name: str = SERVER_NAME) -> ServerMetadata:
    return ServerMetadata(name, reposerve.__version__, list(EXTENSIONS))


def model_metadata(
    name: str, versions: Sequence[int], backend: str, config: ModelConfig
) -> ModelMetadata:
    batch = [-1] if config.max_batch_size > 0 else []

    def tensors(specs: list[TensorConfig]) -> list[TensorMetadata]:
        return [TensorMetadata(spec.name, spec.datatype, batch + spec.shape) for spec in specs]

    return ModelMetadata(
        name,
        [str(version) for version in versions],
        PLATFORMS[backend],
        tensors(config.input),
        tensors(config.output),
    )


_KINDS = {"cpu": "KIND_CPU", "gpu": "KIND_GPU", "auto": "KIND_AUTO", "model": "KIND_MODEL"}


def model_config(name: str, backend: str, config: ModelConfig) -> bytes:
    """``config_document`` as JSON (what a Triton Python model is given)."""
    return encode(config_document(name, backend, config).config)


def config_document(name: str, backend: str, config: ModelConfig) -> ModelConfigDocument:
    """The config in Triton's model-config JSON (what ``GET .../config`` returns): every
    field one of Triton's ``ModelConfig``, so its tools parse it strictly."""
    document: dict[str, Any] = {
        "name": name,
        "platform": PLATFORMS[backend] if backend != "python" else "",
        "backend": TRITON_BACKENDS[backend],
        "version_policy": _version_policy(config),
        "max_batch_size": config.max_batch_size,
        "default_model_filename": config.default_model_filename or "",
        "input": [
            {
                "name": spec.name,
                "data_type": TRITON_CONFIG_TYPES[spec.datatype],
                "format": "FORMAT_NONE",
                "dims": spec.shape,
                **_reshape(spec),
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": spec.optional,
            }
            for spec in config.input
        ],
        "output": [
            {
                "name": spec.name,
                "data_type": TRITON_CONFIG_TYPES[spec.datatype],
                "dims": spec.shape,
                **_reshape(spec),
                "label_filename": spec.label_filename or "",
                "is_shape_tensor": False,
            }
            for spec in config.output
        ],
        "batch_input": [],
        "batch_output": [],
        "instance_group": [
            {
                "name": f"{name}_{index}",
                "kind": _KINDS[group.kind],
                "count": group.count,
                "gpus": group.gpus or [],
                "secondary_devices": [],
                "profile": [],
                "passive": False,
                "host_policy": "",
            }
            for index, group in enumerate(config.instance_group or ())  # resolved once loaded
        ],
        # reposerve-only settings (precision, execution limits, pinned cores) travel in
        # Triton's free-form parameters: a strict protobuf parse rejects any other field.
        "parameters": to_triton_parameters(config),
        "model_warmup": [
            {
                "name": f"warmup_{index}",
                "batch_size": warmup.batch_size,
                "inputs": {
                    spec.name: {
                        "data_type": TRITON_CONFIG_TYPES[spec.datatype],
                        "dims": [max(dim, 1) for dim in spec.shape],
                        "zero_data"
                        if warmup.inputs.get(spec.name, "zero") == "zero"
                        else "random_data": True,
                    }
                    for spec in config.input
                },
            }
            for index, warmup in enumerate(config.warmup)
        ],
        "model_transaction_policy": {"decoupled": config.decoupled},
    }
    if config.step:
        document["ensemble_scheduling"] = {
            "step": [
                {
                    "model_name": step.model,
                    "model_version": step.version,
                    "input_map": step.input_map,
                    "output_map": step.output_map,
                    "model_namespace": "",
                }
                for step in config.step
            ]
        }
    batching = config.dynamic_batching
    if batching is not None:
        document["dynamic_batching"] = {
            "preferred_batch_size": batching.preferred_batch_size,
            "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
            "preserve_ordering": batching.preserve_ordering,
            "priority_levels": batching.priority_levels,
            "default_priority_level": batching.default_priority_level,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": batching.default_timeout_microseconds,
                "allow_timeout_override": True,
                "max_queue_size": batching.max_queue_size,
            },
        }
    return ModelConfigDocument(document)


def _reshape(spec: TensorConfig) -> dict[str, Any]:
    """Triton's ``reshape`` field, there only when the model sees another shape."""
    return {} if spec.reshape is None else {"reshape": {"shape": spec.reshape}}


def _version_policy(config: ModelConfig) -> dict[str, Any]:
    policy = config.version_policy
    if policy.all:
        return {"all": {}}
    if policy.specific is not None:
        return {"specific": {"versions": policy.specific}}
    return {"latest": {"num_versions": policy.latest or 1}}
