"""Triton's ``inference.GRPCInferenceService`` (unary RPCs) and ``grpc.health.v1.Health``,
declared here.

Written from the published KServe V2 / Triton gRPC protocol: message, field and method
names and field numbers are Triton's, so ``tritonclient.grpc`` and any other V2 client
talk to this server unchanged. Like ``reposerve.config.triton_schema`` (whose
``ModelConfig`` the config response embeds), the schema is built at run time into a private
descriptor pool: no protoc, no generated stubs, no clash with the modules tritonclient
registers in the default pool.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from reposerve.config import triton_schema
from reposerve.config.triton_schema import PACKAGE, _field, _map_entry, _message

SERVICE = f"{PACKAGE}.GRPCInferenceService"
HEALTH_PACKAGE = "grpc.health.v1"
HEALTH_SERVICE = f"{HEALTH_PACKAGE}.Health"

# (method, request message, response message), in Triton's order.
METHODS = (
    ("ServerLive", "ServerLiveRequest", "ServerLiveResponse"),
    ("ServerReady", "ServerReadyRequest", "ServerReadyResponse"),
    ("ModelReady", "ModelReadyRequest", "ModelReadyResponse"),
    ("ServerMetadata", "ServerMetadataRequest", "ServerMetadataResponse"),
    ("ModelMetadata", "ModelMetadataRequest", "ModelMetadataResponse"),
    ("ModelInfer", "ModelInferRequest", "ModelInferResponse"),
    ("ModelConfig", "ModelConfigRequest", "ModelConfigResponse"),
    ("ModelStatistics", "ModelStatisticsRequest", "ModelStatisticsResponse"),
    ("RepositoryIndex", "RepositoryIndexRequest", "RepositoryIndexResponse"),
    ("RepositoryModelLoad", "RepositoryModelLoadRequest", "RepositoryModelLoadResponse"),
    ("RepositoryModelUnload", "RepositoryModelUnloadRequest", "RepositoryModelUnloadResponse"),
)


def _parameters(owner: str, value: str = ".InferParameter") -> tuple[Any, Any]:
    """A ``map<string, value> parameters = 4``-style field's entry type and field."""
    return _map_entry("ParametersEntry", value), f"{owner}.ParametersEntry"


def _name_version(name: str) -> descriptor_pb2.DescriptorProto:
    return _message(name, [_field(1, "name", "string"), _field(2, "version", "string")])


def _duration(*names: str) -> list[descriptor_pb2.FieldDescriptorProto]:
    return [
        _field(number, name, ".StatisticDuration") for number, name in enumerate(names, start=1)
    ]


def _infer_messages() -> list[descriptor_pb2.DescriptorProto]:
    parameter = _message(
        "InferParameter",
        [
            _field(1, "bool_param", "bool", oneof=0),
            _field(2, "int64_param", "int64", oneof=0),
            _field(3, "string_param", "string", oneof=0),
            _field(4, "double_param", "double", oneof=0),
            _field(5, "uint64_param", "uint64", oneof=0),
        ],
        oneofs=("parameter_choice",),
    )
    contents = _message(
        "InferTensorContents",
        [
            _field(number, f"{kind}_contents", scalar, repeated=True)
            for number, (kind, scalar) in enumerate(
                [
                    ("bool", "bool"), ("int", "int32"), ("int64", "int64"), ("uint", "uint32"),
                    ("uint64", "uint64"), ("fp32", "float"), ("fp64", "double"),
                    ("bytes", "bytes"),
                ],
                start=1,
            )
        ],
    )  # fmt: skip
    request = ".ModelInferRequest"
    input_entry, input_parameters = _parameters(f"{request}.InferInputTensor")
    output_entry, output_parameters = _parameters(f"{request}.InferRequestedOutputTensor")
    request_entry, request_parameters = _parameters(request)
    infer_request = _message(
        "ModelInferRequest",
        [
            _field(1, "model_name", "string"),
            _field(2, "model_version", "string"),
            _field(3, "id", "string"),
            _field(4, "parameters", request_parameters, repeated=True),
            _field(5, "inputs", f"{request}.InferInputTensor", repeated=True),
            _field(6, "outputs", f"{request}.InferRequestedOutputTensor", repeated=True),
            _field(7, "raw_input_contents", "bytes", repeated=True),
        ],
        nested=(
            _message(
                "InferInputTensor",
                [
                    _field(1, "name", "string"),
                    _field(2, "datatype", "string"),
                    _field(3, "shape", "int64", repeated=True),
                    _field(4, "parameters", input_parameters, repeated=True),
                    _field(5, "contents", ".InferTensorContents"),
                ],
                nested=(input_entry,),
            ),
            _message(
                "InferRequestedOutputTensor",
                [
                    _field(1, "name", "string"),
                    _field(2, "parameters", output_parameters, repeated=True),
                ],
                nested=(output_entry,),
            ),
            request_entry,
        ),
    )
    response = ".ModelInferResponse"
    tensor_entry, tensor_parameters = _parameters(f"{response}.InferOutputTensor")
    response_entry, response_parameters = _parameters(response)
    infer_response = _message(
        "ModelInferResponse",
        [
            _field(1, "model_name", "string"),
            _field(2, "model_version", "string"),
            _field(3, "id", "string"),
            _field(4, "parameters", response_parameters, repeated=True),
            _field(5, "outputs", f"{response}.InferOutputTensor", repeated=True),
            _field(6, "raw_output_contents", "bytes", repeated=True),
        ],
        nested=(
            _message(
                "InferOutputTensor",
                [
                    _field(1, "name", "string"),
                    _field(2, "datatype", "string"),
                    _field(3, "shape", "int64", repeated=True),
                    _field(4, "parameters", tensor_parameters, repeated=True),
                    _field(5, "contents", ".InferTensorContents"),
                ],
                nested=(tensor_entry,),
            ),
            response_entry,
        ),
    )
    return [parameter, contents, infer_request, infer_response]


def _statistics_messages() -> list[descriptor_pb2.DescriptorProto]:
    return [
        _name_version("ModelStatisticsRequest"),
        _message("StatisticDuration", [_field(1, "count", "uint64"), _field(2, "ns", "uint64")]),
        _message(
            "InferStatistics",
            _duration(
                "success",
                "fail",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
                "cache_hit",
                "cache_miss",
            ),
        ),  # fmt: skip
        _message(
            "InferResponseStatistics",
            _duration(
                "compute_infer", "compute_output", "success", "fail", "empty_response", "cancel"
            ),
        ),
        _message(
            "InferBatchStatistics",
            [
                _field(1, "batch_size", "uint64"),
                *[
                    _field(number, name, ".StatisticDuration")
                    for number, name in enumerate(
                        ("compute_input", "compute_infer", "compute_output"), start=2
                    )
                ],
            ],
        ),
        _message(
            "MemoryUsage",
            [
                _field(1, "type", "string"),
                _field(2, "id", "int64"),
                _field(3, "byte_size", "uint64"),
            ],
        ),
        _message(
            "ModelStatistics",
            [
                _field(1, "name", "string"),
                _field(2, "version", "string"),
                _field(3, "last_inference", "uint64"),
                _field(4, "inference_count", "uint64"),
                _field(5, "execution_count", "uint64"),
                _field(6, "inference_stats", ".InferStatistics"),
                _field(7, "batch_stats", ".InferBatchStatistics", repeated=True),
                _field(8, "memory_usage", ".MemoryUsage", repeated=True),
                _field(9, "response_stats", ".ModelStatistics.ResponseStatsEntry", repeated=True),
            ],
            nested=(_map_entry("ResponseStatsEntry", ".InferResponseStatistics"),),
        ),
        _message(
            "ModelStatisticsResponse",
            [_field(1, "model_stats", ".ModelStatistics", repeated=True)],
        ),
    ]


def _repository_messages() -> list[descriptor_pb2.DescriptorProto]:
    parameter = _message(
        "ModelRepositoryParameter",
        [
            _field(1, "bool_param", "bool", oneof=0),
            _field(2, "int64_param", "int64", oneof=0),
            _field(3, "string_param", "string", oneof=0),
            _field(4, "bytes_param", "bytes", oneof=0),
        ],
        oneofs=("parameter_choice",),
    )
    control = []
    for verb in ("Load", "Unload"):
        name = f"RepositoryModel{verb}Request"
        entry, parameters = _parameters(f".{name}", ".ModelRepositoryParameter")
        control.append(
            _message(
                name,
                [
                    _field(1, "repository_name", "string"),
                    _field(2, "model_name", "string"),
                    _field(3, "parameters", parameters, repeated=True),
                ],
                nested=(entry,),
            )
        )
        control.append(_message(f"RepositoryModel{verb}Response", []))
    index = _message(
        "RepositoryIndexResponse",
        [_field(1, "models", ".RepositoryIndexResponse.ModelIndex", repeated=True)],
        nested=(
            _message(
                "ModelIndex",
                [
                    _field(1, "name", "string"),
                    _field(2, "version", "string"),
                    _field(3, "state", "string"),
                    _field(4, "reason", "string"),
                ],
            ),
        ),
    )
    index_request = _message(
        "RepositoryIndexRequest",
        [_field(1, "repository_name", "string"), _field(2, "ready", "bool")],
    )
    return [parameter, index_request, index, *control]


def _service_file() -> descriptor_pb2.FileDescriptorProto:
    metadata_entry = ".ModelMetadataResponse.TensorMetadata"
    messages = [
        _message("ServerLiveRequest", []),
        _message("ServerLiveResponse", [_field(1, "live", "bool")]),
        _message("ServerReadyRequest", []),
        _message("ServerReadyResponse", [_field(1, "ready", "bool")]),
        _name_version("ModelReadyRequest"),
        _message("ModelReadyResponse", [_field(1, "ready", "bool")]),
        _message("ServerMetadataRequest", []),
        _message(
            "ServerMetadataResponse",
            [
                _field(1, "name", "string"),
                _field(2, "version", "string"),
                _field(3, "extensions", "string", repeated=True),
            ],
        ),
        _name_version("ModelMetadataRequest"),
        _message(
            "ModelMetadataResponse",
            [
                _field(1, "name", "string"),
                _field(2, "versions", "string", repeated=True),
                _field(3, "platform", "string"),
                _field(4, "inputs", metadata_entry, repeated=True),
                _field(5, "outputs", metadata_entry, repeated=True),
            ],
            nested=(
                _message(
                    "TensorMetadata",
                    [
                        _field(1, "name", "string"),
                        _field(2, "datatype", "string"),
                        _field(3, "shape", "int64", repeated=True),
                    ],
                ),
            ),
        ),
        *_infer_messages(),
        _name_version("ModelConfigRequest"),
        _message("ModelConfigResponse", [_field(1, "config", ".ModelConfig")]),
        *_statistics_messages(),
        *_repository_messages(),
    ]
    schema = descriptor_pb2.FileDescriptorProto(
        name="reposerve/triton_grpc_service.proto",
        package=PACKAGE,
        syntax="proto3",
        dependency=[triton_schema.FILE_NAME],
    )
    schema.message_type.extend(messages)
    service = schema.service.add(name="GRPCInferenceService")
    for method, request, response in METHODS:
        service.method.add(
            name=method, input_type=f".{PACKAGE}.{request}", output_type=f".{PACKAGE}.{response}"
        )
    return schema


def _health_file() -> descriptor_pb2.FileDescriptorProto:
    """``grpc.health.v1``: what Kubernetes' gRPC probes and grpc_health_probe call."""
    field = descriptor_pb2.FieldDescriptorProto
    status = descriptor_pb2.EnumDescriptorProto(
        name="ServingStatus",
        value=[
            descriptor_pb2.EnumValueDescriptorProto(name=name, number=number)
            for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"))
        ],
    )
    request = descriptor_pb2.DescriptorProto(
        name="HealthCheckRequest",
        field=[field(name="service", number=1, type=field.TYPE_STRING, json_name="service")],
    )
    response = descriptor_pb2.DescriptorProto(
        name="HealthCheckResponse",
        field=[
            field(
                name="status",
                number=1,
                type=field.TYPE_ENUM,
                type_name=f".{HEALTH_PACKAGE}.HealthCheckResponse.ServingStatus",
                json_name="status",
            )
        ],
        enum_type=[status],
    )
    schema = descriptor_pb2.FileDescriptorProto(
        name="reposerve/grpc_health.proto", package=HEALTH_PACKAGE, syntax="proto3"
    )
    schema.message_type.extend([request, response])
    schema.service.add(name="Health").method.add(
        name="Check",
        input_type=f".{HEALTH_PACKAGE}.HealthCheckRequest",
        output_type=f".{HEALTH_PACKAGE}.HealthCheckResponse",
    )
    return schema


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    built = descriptor_pool.DescriptorPool()
    built.Add(triton_schema.file_proto())
    built.Add(_service_file())
    built.Add(_health_file())
    return built


@functools.cache
def message(full_name: str) -> Any:
    """The message class of ``full_name`` (e.g. ``inference.ModelInferRequest``)."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))
