"""What a front calls (``FrontService``): ``reposerve.service.InferenceService`` in the
server's own process, or ``reposerve.fronts.remote.RemoteService`` in a front worker's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from reposerve.answers import Answer
from reposerve.logs import LogSettings, LogUpdate
from reposerve.operations import (
    CudaRegion,
    IndexEntry,
    IndexRequest,
    LoadRequest,
    ModelConfigDocument,
    ModelMetadata,
    ModelStatistics,
    OpenAIModel,
    ServerMetadata,
    SystemRegion,
    UnloadRequest,
)


class FrontService(Protocol):
    async def server_ready(self) -> bool: ...

    async def server_metadata(self) -> ServerMetadata: ...

    async def model_metadata(self, name: str, version: str | None) -> ModelMetadata: ...

    async def model_config(self, name: str, version: str | None) -> ModelConfigDocument: ...

    async def model_ready(self, name: str, version: str | None) -> bool: ...

    async def model_statistics(self, name: str | None, version: str | None) -> ModelStatistics: ...

    async def repository_index(self, request: IndexRequest) -> list[IndexEntry]: ...

    async def load_model(self, request: LoadRequest) -> None: ...

    async def unload_model(self, request: UnloadRequest) -> None: ...

    async def shared_memory_status(self, name: str | None) -> list[SystemRegion]: ...

    async def register_shared_memory(self, region: SystemRegion) -> None: ...

    async def unregister_shared_memory(self, name: str | None) -> None: ...

    async def cuda_memory_status(self, name: str | None) -> list[CudaRegion]: ...

    async def register_cuda_memory(self, name: str) -> None: ...

    async def unregister_cuda_memory(self, name: str | None) -> None: ...

    async def openai_models(self, name: str | None) -> list[OpenAIModel]: ...

    async def log_settings(self) -> LogSettings: ...

    async def update_log_settings(self, update: LogUpdate) -> LogSettings: ...

    async def infer(
        self, name: str, version: str | None, body: bytes, header_length: int | None
    ) -> Answer: ...

    async def infer_parts(
        self, name: str, version: str | None, header: dict[str, Any], raws: list[bytes]
    ) -> Answer: ...

    async def generate(
        self, name: str, version: str | None, body: bytes
    ) -> AsyncIterator[Answer]: ...

    async def stream_parts(
        self, name: str, version: str | None, header: dict[str, Any], raws: list[bytes]
    ) -> AsyncIterator[Answer]: ...
