"""The JSON documents of the V2 protocol and Triton's extensions, other than inference.

Shapes follow Triton so its clients and tools (tritonclient, perf_analyzer) read them:
server metadata, model metadata, the model configuration in Triton's model-config JSON,
statistics and the repository index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

import reposerve
from reposerve.config import ModelConfig, TensorConfig
from reposerve.config.backends import backend_entry
from reposerve.config.triton import to_triton
from reposerve.statistics import ModelStats

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
_encoder = msgspec.json.Encoder()


def encode(document: Any) -> bytes:
    return _encoder.encode(document)


def server_metadata(name: str = SERVER_NAME) -> bytes:
    return encode({"name": name, "version": reposerve.__version__, "extensions": list(EXTENSIONS)})


def model_metadata(name: str, versions: Sequence[int], backend: str, config: ModelConfig) -> bytes:
    batch = [-1] if config.max_batch_size > 0 else []

    def tensors(specs: list[TensorConfig]) -> list[dict[str, Any]]:
        return [
            {"name": spec.name, "datatype": spec.datatype, "shape": batch + spec.shape}
            for spec in specs
        ]

    return encode(
        {
            "name": name,
            "versions": [str(version) for version in versions],
            "platform": _platform(backend),
            "inputs": tensors(config.input),
            "outputs": tensors(config.output),
        }
    )


def _platform(backend: str) -> str:
    """Triton's platform of a backend as model metadata names it (its backend's name
    where Triton has no platform for it: "python")."""
    entry = backend_entry(backend)
    return entry.triton_platform or entry.triton_backend


def model_config(name: str, backend: str, config: ModelConfig) -> bytes:
    """The config in Triton's model-config JSON (what ``GET .../config`` returns)."""
    return encode(to_triton(name, backend, config))


def model_statistics(stats: Sequence[ModelStats]) -> bytes:
    return encode({"model_stats": list(stats)})
