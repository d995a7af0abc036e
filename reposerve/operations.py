"""The typed arguments and results of the service's operations other than inference.

``InferenceService`` takes and returns these values; each front encodes them in its own
protocol: the HTTP front as the V2 JSON documents Triton answers (field names and order
are Triton's, so a Struct's msgspec JSON is the document, byte for byte), the gRPC front
as Triton's protobuf messages (``reposerve.grpc.operations``). They hold only builtins,
bytes and Structs, so a front in another process sends and receives them as msgpack.

Two are defined beside the code that keeps them and named here so that this module is
the one vocabulary a front needs: ``ModelStats`` (``reposerve.statistics``) and the
logging extension's ``LogSettings`` / ``LogUpdate`` (``reposerve.logs``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from reposerve.config.chat_templates import ChatTemplate
from reposerve.logs import LogSettings, LogUpdate
from reposerve.statistics import MemoryUsage, ModelStats

__all__ = [
    "CudaRegion",
    "IndexEntry",
    "IndexRequest",
    "LoadRequest",
    "LogSettings",
    "LogUpdate",
    "ModelConfigDocument",
    "ModelMetadata",
    "ModelStatistics",
    "ModelStats",
    "OpenAIModel",
    "ServerMetadata",
    "SystemRegion",
    "TensorMetadata",
    "UnloadRequest",
]


class ServerMetadata(msgspec.Struct, frozen=True):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(msgspec.Struct, frozen=True):
    name: str
    datatype: str
    shape: list[int]  # -1 for a variable dimension, the batch one included


class ModelMetadata(msgspec.Struct, frozen=True):
    name: str
    versions: list[str]  # the ready ones
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ModelConfigDocument(msgspec.Struct, frozen=True):
    """A model's configuration in Triton's model-config JSON: every key a field of Triton's
    ``ModelConfig`` message, so the document is that message in protobuf's JSON mapping."""

    config: dict[str, Any]


class ModelStatistics(msgspec.Struct):
    model_stats: list[ModelStats]


class IndexRequest(msgspec.Struct, frozen=True):
    ready: bool = False  # only the versions that are ready


class IndexEntry(msgspec.Struct, omit_defaults=True):
    """One row of the repository index (Triton's shape: a model never loaded has only a
    name, one that could not even start a load no version)."""

    name: str
    version: str = ""
    state: str = ""
    reason: str = ""
    # reposerve's addition under on-demand loading or a memory budget: what a loaded
    # version holds, as /stats says (gRPC drops it)
    memory_usage: list[MemoryUsage] = []


class LoadRequest(msgspec.Struct, frozen=True):
    """Load (or reload) ``name``, optionally from another configuration and model files."""

    name: str
    config: str | None = None  # Triton's model-config JSON, used instead of the folder's
    files: dict[str, bytes] = {}  # path inside the model folder -> content, as sent


class UnloadRequest(msgspec.Struct, frozen=True):
    name: str
    unload_dependents: bool = False  # the ensembles that call the model go too


class SystemRegion(msgspec.Struct, frozen=True):
    """A client's system shared-memory region: ``byte_size`` bytes from ``offset`` of the
    shared-memory object ``key`` (``/name``, as shm_open names it), called ``name`` in
    requests. A register's argument, and a row of the status (Triton's document)."""

    name: str
    key: str
    offset: int
    byte_size: int


class CudaRegion(msgspec.Struct, frozen=True):
    """A row of the CUDA shared-memory status (Triton's document)."""

    name: str
    device_id: int
    byte_size: int


class OpenAIModel(msgspec.Struct, frozen=True):
    """A model on the OpenAI-compatible routes (its ``[openai]`` table, resolved):
    ``input`` and ``output`` the tensors those routes use, ``inputs`` every declared input
    with its datatype (generation parameters go to those that exist), ``created`` when it
    was loaded (seconds since the epoch; 0 when it is not), ``chat_template`` when it is
    a chat model ready to serve."""

    name: str
    kind: str
    input: str
    output: str
    inputs: dict[str, str]
    outputs: list[str]
    max_tokens: int
    decoupled: bool = False
    batched: bool = False  # max_batch_size > 0: requests carry a batch dimension
    input_shape: list[int] = []  # the text input's shape, the batch dimension left out
    created: int = 0
    chat_template: ChatTemplate | None = None
