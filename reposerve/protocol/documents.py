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
from reposerve.config.backends import backend_entry
from reposerve.config.triton import to_triton
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
_encoder = msgspec.json.Encoder()


def encode(document: Any) -> bytes:
    """A document (a Struct or builtins) as its V2 JSON."""
    return _encoder.encode(document)


def server_metadata(name: str = SERVER_NAME, shared_memory: bool = False) -> ServerMetadata:
    """``shared_memory``: client shared memory is on (--allow-client-shm)."""
    extensions = [*EXTENSIONS, "system_shared_memory"] if shared_memory else list(EXTENSIONS)
    return ServerMetadata(name, reposerve.__version__, extensions)


def model_metadata(
    name: str, versions: Sequence[int], backend: str, config: ModelConfig
) -> ModelMetadata:
    batch = [-1] if config.max_batch_size > 0 else []

    def tensors(specs: list[TensorConfig]) -> list[TensorMetadata]:
        return [TensorMetadata(spec.name, spec.datatype, batch + spec.shape) for spec in specs]

    return ModelMetadata(
        name,
        [str(version) for version in versions],
        _platform(backend),
        tensors(config.input),
        tensors(config.output),
    )


def _platform(backend: str) -> str:
    """Triton's platform of a backend as model metadata names it (its backend's name
    where Triton has no platform for it: "python")."""
    entry = backend_entry(backend)
    return entry.triton_platform or entry.triton_backend


def model_config(name: str, backend: str, config: ModelConfig) -> bytes:
    """``config_document`` as JSON (what a Triton Python model is given)."""
    return encode(to_triton(name, backend, config))


def config_document(name: str, backend: str, config: ModelConfig) -> ModelConfigDocument:
    """The config in Triton's model-config JSON (what ``GET .../config`` returns): every
    field one of Triton's ``ModelConfig``, so its tools parse it strictly."""
    return ModelConfigDocument(to_triton(name, backend, config))
