"""The service's operations other than inference, in Triton's protobuf messages.

Requests become the Structs of ``reposerve.operations`` and results become response
messages, field by field: no JSON between them, and a load's files stay the bytes that
came (``bytes_param``). The model config is the one document built as Triton's
model-config JSON (``ModelConfigDocument``), which is its message's JSON mapping.
"""

from __future__ import annotations

from typing import Any

import msgspec
from google.protobuf import json_format

from reposerve.errors import ProtocolError
from reposerve.grpc import schema
from reposerve.grpc.infer import parameter_value
from reposerve.operations import (
    IndexEntry,
    IndexRequest,
    LoadRequest,
    ModelConfigDocument,
    ModelMetadata,
    ModelStatistics,
    ServerMetadata,
    TensorMetadata,
    UnloadRequest,
)
from reposerve.protocol.repository import load_request, unload_request
from reposerve.statistics import Duration


def response(method: str, **fields: Any) -> Any:
    """A new ``{method}Response`` message."""
    return schema.message_class(f"{schema.PACKAGE}.{method}Response")(**fields)


# -- requests ----------------------------------------------------------------------------


def to_index_request(request: Any) -> IndexRequest:
    return IndexRequest(ready=request.ready)


def to_load_request(request: Any) -> LoadRequest:
    """A ``RepositoryModelLoadRequest``: ``config`` a string, files ``bytes_param``."""
    return load_request(request.model_name, _parameters(request), _file_content)


def to_unload_request(request: Any) -> UnloadRequest:
    return unload_request(request.model_name, _parameters(request))


def _parameters(request: Any) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in request.parameters.items()}


def _file_content(value: object, where: str) -> bytes:
    if not isinstance(value, bytes):
        raise ProtocolError(f"{where}: expected the file content as bytes (bytes_param)")
    return value


# -- results -----------------------------------------------------------------------------


def server_metadata(result: ServerMetadata) -> Any:
    return response(
        "ServerMetadata", name=result.name, version=result.version, extensions=result.extensions
    )


def model_metadata(result: ModelMetadata) -> Any:
    return response(
        "ModelMetadata",
        name=result.name,
        versions=result.versions,
        platform=result.platform,
        inputs=[_tensor(tensor) for tensor in result.inputs],
        outputs=[_tensor(tensor) for tensor in result.outputs],
    )


def _tensor(tensor: TensorMetadata) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}


def model_config(result: ModelConfigDocument) -> Any:
    message = response("ModelConfig")
    # Fields of Triton's that this server's ModelConfig message does not declare
    # (batch_input, ...) are dropped, as its clients would drop them.
    json_format.ParseDict(result.config, message.config, ignore_unknown_fields=True)
    return message


def repository_index(entries: list[IndexEntry]) -> Any:
    models = [
        {"name": entry.name, "version": entry.version, "state": entry.state, "reason": entry.reason}
        for entry in entries
    ]
    return response("RepositoryIndex", models=models)


def model_statistics(result: ModelStatistics) -> Any:
    """Triton's fields of each model's statistics (reposerve's own, such as
    ``isolation_stats``, have no place in the message and stay out)."""
    return response(
        "ModelStatistics",
        model_stats=[
            {
                "name": stats.name,
                "version": stats.version,
                "last_inference": stats.last_inference,
                "inference_count": stats.inference_count,
                "execution_count": stats.execution_count,
                "inference_stats": _durations(stats.inference_stats),
                "batch_stats": [
                    {"batch_size": batch.batch_size, **_durations(batch)}
                    for batch in stats.batch_stats
                ],
                "memory_usage": [
                    {"type": usage.type, "id": usage.id, "byte_size": usage.byte_size}
                    for usage in stats.memory_usage
                ],
            }
            for stats in result.model_stats
        ],
    )


def _durations(record: msgspec.Struct) -> dict[str, dict[str, int]]:
    """Each ``Duration`` field of ``record`` as its ``StatisticDuration``."""
    return {
        field: {"count": value.count, "ns": value.ns}
        for field in record.__struct_fields__
        if isinstance(value := getattr(record, field), Duration)
    }
