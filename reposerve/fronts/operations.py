"""The service's operations other than inference, as a front process calls them: each
name with the types of its arguments and of its result, which travel as msgpack."""

from __future__ import annotations

from typing import Any

from reposerve.operations import (
    CudaRegion,
    IndexEntry,
    IndexRequest,
    LoadRequest,
    LogSettings,
    LogUpdate,
    ModelConfigDocument,
    ModelMetadata,
    ModelStatistics,
    OpenAIModel,
    ServerMetadata,
    SystemRegion,
    UnloadRequest,
)

_NAME = str
_VERSION = str | None

# name -> (argument types, result type)
OPERATIONS: dict[str, tuple[tuple[Any, ...], Any]] = {
    "server_ready": ((), bool),
    "server_metadata": ((), ServerMetadata),
    "model_metadata": ((_NAME, _VERSION), ModelMetadata),
    "model_config": ((_NAME, _VERSION), ModelConfigDocument),
    "model_ready": ((_NAME, _VERSION), bool),
    "model_statistics": ((str | None, _VERSION), ModelStatistics),
    "repository_index": ((IndexRequest,), list[IndexEntry]),
    "load_model": ((LoadRequest,), None),
    "unload_model": ((UnloadRequest,), None),
    "openai_models": ((str | None,), list[OpenAIModel]),
    "log_settings": ((), LogSettings),
    "update_log_settings": ((LogUpdate,), LogSettings),
    "shared_memory_status": ((str | None,), list[SystemRegion]),
    "register_shared_memory": ((SystemRegion,), None),
    "unregister_shared_memory": ((str | None,), None),
    "cuda_memory_status": ((str | None,), list[CudaRegion]),
    "register_cuda_memory": ((str,), None),
    "unregister_cuda_memory": ((str | None,), None),
}
