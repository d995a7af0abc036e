"""The service's operations other than inference, as Triton's unary gRPC calls.

Each call (``CALLS``, by Triton's method name) turns its request message into the
operation (a Struct of ``reposerve.operations``), has ``FrontService`` perform it and
builds its response message from the result field by field (``build``): no JSON between
them, and a load's files stay the bytes that came (``bytes_param``). The model config is
the one result that is a document, Triton's model-config JSON, which is its message's
JSON mapping.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from google.protobuf import json_format

from reposerve.errors import ProtocolError
from reposerve.front_service import FrontService
from reposerve.grpc import schema
from reposerve.grpc.infer import parameter_value
from reposerve.operations import (
    CudaSharedMemoryRegisterRequest,
    CudaSharedMemoryStatusRequest,
    CudaSharedMemoryUnregisterRequest,
    IndexRequest,
    ModelConfigRequest,
    ModelMetadataRequest,
    ModelReadyRequest,
    ModelStatisticsRequest,
    ServerMetadataRequest,
    SystemRegion,
    SystemSharedMemoryRegisterRequest,
    SystemSharedMemoryStatusRequest,
    SystemSharedMemoryUnregisterRequest,
)
from reposerve.protocol.repository import load_request, unload_request

# One unary call: (the service, its request message) -> its response message.
Call = Callable[[FrontService, Any], Awaitable[Any]]


def response(method: str, **fields: Any) -> Any:
    """A new ``{method}Response`` message."""
    return schema.message_class(f"{schema.PACKAGE}.{method}Response")(**fields)


def build(method: str, result: msgspec.Struct) -> Any:
    """``{method}Response`` with ``result``'s fields."""
    message = response(method)
    _fill(message, result)
    return message


def _fill(message: Any, value: msgspec.Struct) -> None:
    """Copy ``value`` into ``message`` by field name, Structs into messages. A field the
    message does not declare is reposerve's addition to Triton's document (such as
    ``isolation_stats``), which the JSON carries and gRPC has no place for."""
    declared = message.DESCRIPTOR.fields_by_name
    for name in value.__struct_fields__:
        field = declared.get(name)
        if field is None:
            continue
        item = getattr(value, name)
        if field.message_type is None:
            if isinstance(item, list):
                getattr(message, name).extend(item)
            else:
                setattr(message, name, item)
        elif isinstance(item, list):
            for element in item:
                _fill(getattr(message, name).add(), element)
        else:
            _fill(getattr(message, name), item)


def _version(request: Any) -> str | None:
    return request.version or None


def _parameters(request: Any) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in request.parameters.items()}


def _file_content(value: object, where: str) -> bytes:
    if not isinstance(value, bytes):
        raise ProtocolError(f"{where}: expected the file content as bytes (bytes_param)")
    return value


async def _model_ready(service: FrontService, request: Any) -> Any:
    ready = await service.perform(ModelReadyRequest(request.name, _version(request)))
    return response("ModelReady", ready=ready)


async def _server_metadata(service: FrontService, request: Any) -> Any:
    return build("ServerMetadata", await service.perform(ServerMetadataRequest()))


async def _model_metadata(service: FrontService, request: Any) -> Any:
    operation = ModelMetadataRequest(request.name, _version(request))
    return build("ModelMetadata", await service.perform(operation))


async def _model_config(service: FrontService, request: Any) -> Any:
    document = await service.perform(ModelConfigRequest(request.name, _version(request)))
    message = response("ModelConfig")
    # Fields of Triton's that this server's ModelConfig message does not declare
    # (batch_input, ...) are dropped, as its clients would drop them.
    json_format.ParseDict(document.config, message.config, ignore_unknown_fields=True)
    return message


async def _model_statistics(service: FrontService, request: Any) -> Any:
    operation = ModelStatisticsRequest(request.name or None, _version(request))
    return build("ModelStatistics", await service.perform(operation))


async def _repository_index(service: FrontService, request: Any) -> Any:
    entries = await service.perform(IndexRequest(ready=request.ready))
    message = response("RepositoryIndex")
    for entry in entries:
        _fill(message.models.add(), entry)
    return message


async def _repository_model_load(service: FrontService, request: Any) -> Any:
    load = load_request(request.model_name, _parameters(request), _file_content)
    await service.perform(load)
    return response("RepositoryModelLoad")


async def _repository_model_unload(service: FrontService, request: Any) -> Any:
    await service.perform(unload_request(request.model_name, _parameters(request)))
    return response("RepositoryModelUnload")


# Triton's shared-memory extension: an empty name = every region.
async def _system_shared_memory_status(service: FrontService, request: Any) -> Any:
    message = response("SystemSharedMemoryStatus")
    operation = SystemSharedMemoryStatusRequest(request.name or None)
    for region in await service.perform(operation):
        _fill(message.regions[region.name], region)
    return message


async def _system_shared_memory_register(service: FrontService, request: Any) -> Any:
    region = SystemRegion(request.name, request.key, request.offset, request.byte_size)
    await service.perform(SystemSharedMemoryRegisterRequest(region))
    return response("SystemSharedMemoryRegister")


async def _system_shared_memory_unregister(service: FrontService, request: Any) -> Any:
    await service.perform(SystemSharedMemoryUnregisterRequest(request.name or None))
    return response("SystemSharedMemoryUnregister")


async def _cuda_shared_memory_status(service: FrontService, request: Any) -> Any:
    message = response("CudaSharedMemoryStatus")
    operation = CudaSharedMemoryStatusRequest(request.name or None)
    for region in await service.perform(operation):
        _fill(message.regions[region.name], region)
    return message


async def _cuda_shared_memory_register(service: FrontService, request: Any) -> Any:
    await service.perform(CudaSharedMemoryRegisterRequest(request.name))
    return response("CudaSharedMemoryRegister")


async def _cuda_shared_memory_unregister(service: FrontService, request: Any) -> Any:
    await service.perform(CudaSharedMemoryUnregisterRequest(request.name or None))
    return response("CudaSharedMemoryUnregister")


CALLS: dict[str, Call] = {
    "ModelReady": _model_ready,
    "ServerMetadata": _server_metadata,
    "ModelMetadata": _model_metadata,
    "ModelConfig": _model_config,
    "ModelStatistics": _model_statistics,
    "RepositoryIndex": _repository_index,
    "RepositoryModelLoad": _repository_model_load,
    "RepositoryModelUnload": _repository_model_unload,
    "SystemSharedMemoryStatus": _system_shared_memory_status,
    "SystemSharedMemoryRegister": _system_shared_memory_register,
    "SystemSharedMemoryUnregister": _system_shared_memory_unregister,
    "CudaSharedMemoryStatus": _cuda_shared_memory_status,
    "CudaSharedMemoryRegister": _cuda_shared_memory_register,
    "CudaSharedMemoryUnregister": _cuda_shared_memory_unregister,
}
