"""The service's typed operations in each protocol: a result encoded as V2 JSON (the HTTP
front) and built as protobuf (the gRPC front) say the same thing, the JSON is the document
Triton's clients read, a request decodes to the same Struct from either front, every
Struct crosses a process boundary as msgpack unchanged, and the service performs every
operation there is."""

from __future__ import annotations

import asyncio
import base64
import json
import typing
from typing import Any

import msgspec
import pytest
from google.protobuf import json_format

from reposerve.config import parse_model_config
from reposerve.errors import ProtocolError, ReposerveError
from reposerve.grpc import schema
from reposerve.grpc.operations import CALLS
from reposerve.grpc.server import UNARY
from reposerve.logs import LogUpdate
from reposerve.operations import (
    AnyOperation,
    CudaSharedMemoryRegisterRequest,
    CudaSharedMemoryStatusRequest,
    CudaSharedMemoryUnregisterRequest,
    IndexEntry,
    IndexRequest,
    LoadRequest,
    LogSettings,
    LogSettingsRequest,
    LogUpdateRequest,
    ModelConfigRequest,
    ModelMetadataRequest,
    ModelReadyRequest,
    ModelStatistics,
    ModelStatisticsRequest,
    OpenAIModelsRequest,
    Operation,
    ServerMetadataRequest,
    ServerReadyRequest,
    SystemRegion,
    SystemSharedMemoryRegisterRequest,
    SystemSharedMemoryStatusRequest,
    SystemSharedMemoryUnregisterRequest,
    UnloadRequest,
    result_type,
)
from reposerve.protocol import documents
from reposerve.protocol.repository import (
    decode_index_request,
    decode_load_request,
    decode_unload_request,
)
from reposerve.repository import Repository
from reposerve.service import InferenceService
from reposerve.statistics import BatchStats, Duration, InferenceStats, MemoryUsage, ModelStats
from tests.toy_models import EVERY_SETTING

pytestmark = pytest.mark.unit

# Not UTF-8, not text at all: what a model file (an ONNX graph) may hold.
BINARY = bytes(range(256)) + b"\xff\xfe\x00\xc3\x28"


def _message(kind: str, **fields: object) -> object:
    return schema.message_class(f"{schema.PACKAGE}.{kind}")(**fields)


class _Service:
    """The service as the gRPC calls see it: each operation answers ``result`` and is
    recorded."""

    def __init__(self, result: object = None) -> None:
        self.result = result
        self.calls: list[Operation[Any]] = []

    async def perform(self, operation: Operation[Any]) -> object:
        self.calls.append(operation)
        return self.result


def _call(method: str, service: _Service, request: object = None) -> object:
    """``method`` of the gRPC front's operations, as a client's call reaches it."""
    if request is None:
        request = _message(f"{method}Request")
    return asyncio.run(CALLS[method](service, request))


def _from_json(document: bytes, message: object) -> object:
    """What the gRPC front used to answer: the V2 JSON parsed into the message."""
    return json_format.Parse(document, message, ignore_unknown_fields=True)


def _statistics() -> ModelStatistics:
    """Every field away from its default, so that a field left out shows."""

    def duration(n: int) -> Duration:
        return Duration(count=n, ns=1000 * n + 7)

    stats = InferenceStats(*(duration(n) for n in range(1, 9)))
    batch = BatchStats(4, duration(11), duration(12), duration(13))
    return ModelStatistics(
        [
            ModelStats(
                name="m",
                version="2",
                last_inference=1_700_000_000_123,
                inference_count=2**40,  # past 32 bits: uint64 on the wire
                execution_count=9,
                inference_stats=stats,
                batch_stats=[batch, BatchStats(1)],
                memory_usage=[MemoryUsage("GPU", 1, 2**33)],
            ),
            ModelStats(name="idle", version="1"),
        ]
    )


def test_statistics_read_the_same_over_http_and_grpc():
    result = _statistics()
    document = documents.encode(result)
    service = _Service(result)
    built = _call("ModelStatistics", service, _message("ModelStatisticsRequest", name="m"))
    assert service.calls == [ModelStatisticsRequest("m", None)]
    assert built == _from_json(document, _message("ModelStatisticsResponse"))
    first = built.model_stats[0]
    assert first.inference_count == 2**40
    assert first.inference_stats.cache_miss.ns == 8007
    assert first.batch_stats[0].compute_output.count == 13
    assert first.memory_usage[0].byte_size == 2**33
    # reposerve's own addition stays in the JSON only
    assert "isolation_stats" in json.loads(document)["model_stats"][0]


def test_statistics_json_is_triton_document_unchanged():
    """Byte for byte what the HTTP front answered when it encoded a plain dict."""
    result = _statistics()
    memory = [{"type": "GPU", "id": 1, "byte_size": 2**33}]
    as_dicts = [
        msgspec.structs.replace(stats, memory_usage=memory if stats.memory_usage else [])
        for stats in result.model_stats
    ]
    assert documents.encode(result) == documents.encode({"model_stats": as_dicts})


CONFIG = parse_model_config(EVERY_SETTING, "m/config.toml")


@pytest.mark.parametrize(
    ("result", "method", "field"),
    [
        (documents.server_metadata("triton"), "ServerMetadata", None),
        (documents.model_metadata("m", [1, 3], "python", CONFIG), "ModelMetadata", None),
        (documents.config_document("m", "python", CONFIG), "ModelConfig", "config"),
    ],
    ids=["server_metadata", "model_metadata", "model_config"],
)
def test_documents_read_the_same_over_http_and_grpc(result, method, field):
    built = _call(method, _Service(result))
    expected = _message(f"{method}Response")
    if field is None:
        document = documents.encode(result)
        assert built == _from_json(document, expected)
    else:  # the HTTP front answers the wrapped document itself
        document = documents.encode(getattr(result, field))
        _from_json(document, getattr(expected, field))
        assert built == expected
    assert built.ByteSize() > 0


def test_model_metadata_json_keeps_triton_shape():
    document = json.loads(documents.encode(documents.model_metadata("m", [1], "python", CONFIG)))
    assert list(document) == ["name", "versions", "platform", "inputs", "outputs"]
    assert document["inputs"][0] == {"name": "INPUT", "datatype": "FP32", "shape": [-1, 16]}


def test_index_reads_the_same_over_http_and_grpc():
    entries = [
        IndexEntry("never_loaded"),
        IndexEntry("broken", state="UNAVAILABLE", reason="bad config"),
        IndexEntry("m", "1", "READY"),
    ]
    document = documents.encode(entries)
    assert document.startswith(b'[{"name":"never_loaded"},')  # empty fields left out
    service = _Service(entries)
    built = _call("RepositoryIndex", service, _message("RepositoryIndexRequest", ready=True))
    assert built == _from_json(b'{"models": %s}' % document, _message("RepositoryIndexResponse"))
    assert service.calls == [decode_index_request(b'{"ready":true}')]
    assert decode_index_request(b"") == IndexRequest(ready=False)


def _on_the_wire(name: str, **parameters: tuple[str, object]) -> object:
    """A repository control request as the gRPC front receives it: serialized, parsed."""
    message = schema.message_class(f"{schema.PACKAGE}.{name}")(model_name="m")
    for key, (kind, value) in parameters.items():
        setattr(message.parameters[key], kind, value)
    return type(message).FromString(message.SerializeToString())


def test_grpc_load_files_arrive_as_the_bytes_sent():
    service = _Service()
    request = _on_the_wire(
        "RepositoryModelLoadRequest",
        config=("string_param", '{"max_batch_size": 2}'),
        **{"file:1/model.onnx": ("bytes_param", BINARY)},
    )
    _call("RepositoryModelLoad", service, request)
    [load] = service.calls
    assert load == LoadRequest("m", '{"max_batch_size": 2}', {"1/model.onnx": BINARY})
    # The same load over HTTP, its file base64 in JSON, is the same request.
    body = {
        "parameters": {
            "config": '{"max_batch_size": 2}',
            "file:1/model.onnx": base64.b64encode(BINARY).decode(),
        }
    }
    assert decode_load_request("m", msgspec.json.encode(body)) == load


def test_grpc_load_file_as_text_is_refused():
    request = _on_the_wire(
        "RepositoryModelLoadRequest",
        config=("string_param", "{}"),
        **{"file:1/model.py": ("string_param", "print()")},
    )
    with pytest.raises(ProtocolError) as error:
        _call("RepositoryModelLoad", _Service(), request)
    assert error.value.message == (
        "load 'm': parameters.file:1/model.py: expected the file content as bytes (bytes_param)"
    )


def test_grpc_and_http_unload_agree():
    service = _Service()
    request = _on_the_wire("RepositoryModelUnloadRequest", unload_dependents=("bool_param", True))
    _call("RepositoryModelUnload", service, request)
    body = b'{"parameters": {"unload_dependents": true}}'
    assert service.calls == [UnloadRequest("m", True)] == [decode_unload_request("m", body)]
    wrong = _on_the_wire("RepositoryModelUnloadRequest", unload_dependents=("string_param", "yes"))
    message = "unload 'm': parameter unload_dependents must be a bool"
    with pytest.raises(ProtocolError, match=message):
        _call("RepositoryModelUnload", _Service(), wrong)
    with pytest.raises(ProtocolError, match=message):
        decode_unload_request("m", b'{"parameters": {"unload_dependents": "yes"}}')


@pytest.mark.parametrize(
    "value",
    [
        documents.server_metadata("triton"),
        documents.model_metadata("m", [1], "python", CONFIG),
        documents.config_document("m", "python", CONFIG),
        _statistics(),
        IndexRequest(ready=True),
        IndexEntry("m", "1", "UNAVAILABLE", "it failed"),
        LoadRequest("m", "{}", {"1/model.onnx": BINARY}),
        UnloadRequest("m", unload_dependents=True),
        LogSettings(log_verbose_level=2),
    ],
    ids=lambda value: type(value).__name__,
)
def test_structs_cross_processes_as_msgpack(value):
    """What a front in another process will receive is what the service made."""
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=type(value))
    assert decoded == value


# One of each operation, every field away from its default.
EVERY_OPERATION = [
    ServerReadyRequest(),
    ServerMetadataRequest(),
    ModelReadyRequest("m", "1"),
    ModelMetadataRequest("m", "1"),
    ModelConfigRequest("m", "1"),
    ModelStatisticsRequest("m", "1"),
    IndexRequest(ready=True),
    LoadRequest("m", "{}", {"1/model.onnx": BINARY}),
    UnloadRequest("m", unload_dependents=True),
    OpenAIModelsRequest("m"),
    LogSettingsRequest(),
    LogUpdateRequest(LogUpdate(log_info=False, log_verbose_level=1)),
    SystemSharedMemoryStatusRequest("r"),
    SystemSharedMemoryRegisterRequest(SystemRegion("r", "/r", 8, 64)),
    SystemSharedMemoryUnregisterRequest("r"),
    CudaSharedMemoryStatusRequest("r"),
    CudaSharedMemoryRegisterRequest("r"),
    CudaSharedMemoryUnregisterRequest("r"),
]


def test_every_operation_is_in_the_union_a_front_sends():
    """An operation left out of ``AnyOperation`` would encode in a front worker and fail
    to decode in the core."""
    kinds = set(Operation.__subclasses__())
    assert set(typing.get_args(AnyOperation)) == kinds == {type(o) for o in EVERY_OPERATION}
    assert result_type(IndexRequest) == list[IndexEntry]
    assert result_type(LoadRequest) is type(None)
    assert result_type(LogUpdateRequest) is LogSettings


@pytest.mark.parametrize("operation", EVERY_OPERATION, ids=lambda value: type(value).__name__)
def test_operations_cross_processes_as_msgpack(operation):
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(operation), type=AnyOperation)
    assert decoded == operation and type(decoded) is type(operation)


@pytest.mark.parametrize("operation", EVERY_OPERATION, ids=lambda value: type(value).__name__)
def test_the_service_performs_every_operation(operation, tmp_path):
    """Each has its case: a result of its type (as a front in another process decodes
    it), or the service's own refusal on an empty repository; never "not an operation"."""

    async def perform() -> object:
        service = InferenceService(Repository([tmp_path], 1.0, 1.0))
        return await service.perform(operation)

    try:
        result = asyncio.run(perform())
    except ReposerveError:
        return
    kind = result_type(type(operation))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(result), type=kind) == result


def test_every_unary_grpc_method_has_its_call():
    """The gRPC front registers ``UNARY[method]`` for each of Triton's unary methods: one
    missing would fail its start, one extra would never be called."""
    assert set(UNARY) == {method for method, *_ in schema.METHODS}
    assert CALLS.items() <= UNARY.items()
