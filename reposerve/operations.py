"""The service's operations other than inference, as typed values, and their results.

Each operation is one tagged Struct (``...Request``) whose fields are its arguments and
whose type parameter is its result (``IndexRequest`` is an ``Operation[list[IndexEntry]]``):
``InferenceService.perform`` runs it in one ``match``, and every front builds the value
from its protocol's request and encodes the result in its own: the HTTP front as the V2
JSON documents Triton answers (field names and order are Triton's, so a result's msgspec
JSON is the document, byte for byte), the gRPC front as Triton's protobuf messages
(``reposerve.grpc.operations``). Operations and results hold only builtins, bytes and
Structs, so a front in another process sends the operation itself as msgpack
(``reposerve.fronts.frames.Operate``) and decodes the result as ``result_type`` says.

Adding an operation: its Struct here (and in ``AnyOperation``), its case in
``InferenceService.perform``, and its routes in the fronts.

Two results are defined beside the code that keeps them and named here so that this
module is the one vocabulary a front needs: ``ModelStats`` (``reposerve.statistics``) and
the logging extension's ``LogSettings`` / ``LogUpdate`` (``reposerve.logs``).
"""

from __future__ import annotations

import functools
import typing
from typing import Any, Generic, TypeVar

import msgspec

from reposerve.config.chat_templates import ChatTemplate
from reposerve.logs import LogSettings, LogUpdate
from reposerve.statistics import MemoryUsage, ModelStats

__all__ = [
    "AnyOperation",
    "CudaRegion",
    "CudaSharedMemoryRegisterRequest",
    "CudaSharedMemoryStatusRequest",
    "CudaSharedMemoryUnregisterRequest",
    "IndexEntry",
    "IndexRequest",
    "LoadRequest",
    "LogSettings",
    "LogSettingsRequest",
    "LogUpdate",
    "LogUpdateRequest",
    "ModelConfigDocument",
    "ModelConfigRequest",
    "ModelMetadata",
    "ModelMetadataRequest",
    "ModelReadyRequest",
    "ModelStatistics",
    "ModelStatisticsRequest",
    "ModelStats",
    "OpenAIModel",
    "OpenAIModelsRequest",
    "Operation",
    "ServerMetadata",
    "ServerMetadataRequest",
    "ServerReadyRequest",
    "SystemRegion",
    "SystemSharedMemoryRegisterRequest",
    "SystemSharedMemoryStatusRequest",
    "SystemSharedMemoryUnregisterRequest",
    "TensorMetadata",
    "UnloadRequest",
    "result_type",
]

R = TypeVar("R", covariant=True)  # an operation of a narrower result is one of a wider

# -- the results -------------------------------------------------------------------------


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


# -- the operations ----------------------------------------------------------------------


# Subclasses repeat ``frozen=True``: msgspec inherits it, but a type checker reads each
# class's own keywords only (PEP 681's dataclass_transform).
class Operation(msgspec.Struct, Generic[R], frozen=True, tag=True):
    """One of the service's operations, its result an ``R``. Tagged by class name, so that
    ``AnyOperation`` decodes any of them from one frame."""


@functools.cache
def result_type(kind: type[Operation[Any]]) -> Any:
    """The ``R`` of ``kind`` (an ``Operation[R]``): what its result decodes as."""
    (base,) = kind.__dict__["__orig_bases__"]
    return typing.get_args(base)[0]


class ServerReadyRequest(Operation[bool], frozen=True):
    """Whether the server can serve (``InferenceService.ready``)."""


class ServerMetadataRequest(Operation[ServerMetadata], frozen=True):
    pass


class ModelReadyRequest(Operation[bool], frozen=True):
    name: str
    version: str | None = None  # None: the version the model serves by default


class ModelMetadataRequest(Operation[ModelMetadata], frozen=True):
    name: str
    version: str | None = None


class ModelConfigRequest(Operation[ModelConfigDocument], frozen=True):
    name: str
    version: str | None = None


class ModelStatisticsRequest(Operation[ModelStatistics], frozen=True):
    name: str | None = None  # None: every loaded model
    version: str | None = None  # None: every version of ``name``


class IndexRequest(Operation[list[IndexEntry]], frozen=True):
    ready: bool = False  # only the versions that are ready


class LoadRequest(Operation[None], frozen=True):
    """Load (or reload) ``name``, optionally from another configuration and model files."""

    name: str
    config: str | None = None  # Triton's model-config JSON, used instead of the folder's
    files: dict[str, bytes] = {}  # path inside the model folder -> content, as sent


class UnloadRequest(Operation[None], frozen=True):
    name: str
    unload_dependents: bool = False  # the ensembles that call the model go too


class OpenAIModelsRequest(Operation[list[OpenAIModel]], frozen=True):
    """The models on the OpenAI-compatible routes; ``name``: that one, ready to serve."""

    name: str | None = None


class LogSettingsRequest(Operation[LogSettings], frozen=True):
    pass


class LogUpdateRequest(Operation[LogSettings], frozen=True):
    update: LogUpdate


# Triton's shared-memory extension: a ``name`` of None = every region.
class SystemSharedMemoryStatusRequest(Operation[list[SystemRegion]], frozen=True):
    name: str | None = None


class SystemSharedMemoryRegisterRequest(Operation[None], frozen=True):
    region: SystemRegion


class SystemSharedMemoryUnregisterRequest(Operation[None], frozen=True):
    """Done once the requests using the region(s) have ended (``reposerve.shared_memory``)."""

    name: str | None = None


class CudaSharedMemoryStatusRequest(Operation[list[CudaRegion]], frozen=True):
    name: str | None = None


class CudaSharedMemoryRegisterRequest(Operation[None], frozen=True):
    name: str


class CudaSharedMemoryUnregisterRequest(Operation[None], frozen=True):
    name: str | None = None


AnyOperation = (
    ServerReadyRequest
    | ServerMetadataRequest
    | ModelReadyRequest
    | ModelMetadataRequest
    | ModelConfigRequest
    | ModelStatisticsRequest
    | IndexRequest
    | LoadRequest
    | UnloadRequest
    | OpenAIModelsRequest
    | LogSettingsRequest
    | LogUpdateRequest
    | SystemSharedMemoryStatusRequest
    | SystemSharedMemoryRegisterRequest
    | SystemSharedMemoryUnregisterRequest
    | CudaSharedMemoryStatusRequest
    | CudaSharedMemoryRegisterRequest
    | CudaSharedMemoryUnregisterRequest
)
"""Every operation: what a front's ``Operate`` frame carries."""
