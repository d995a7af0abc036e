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
from reposerve.config.triton_schema import PACKAGE, field, map_entry, message

SERVICE = f"{PACKAGE}.GRPCInferenceService"
HEALTH_PACKAGE = "grpc.health.v1"
HEALTH_SERVICE = f"{HEALTH_PACKAGE}.Health"

# (method, request message, response message, category), in Triton's order. The category
# is the protocol --grpc-restricted-protocol names it by (Triton's names, as for HTTP).
METHODS = (
    ("ServerLive", "ServerLiveRequest", "ServerLiveResponse", "health"),
    ("ServerReady", "ServerReadyRequest", "ServerReadyResponse", "health"),
    ("ModelReady", "ModelReadyRequest", "ModelReadyResponse", "health"),
    ("ServerMetadata", "ServerMetadataRequest", "ServerMetadataResponse", "metadata"),
    ("ModelMetadata", "ModelMetadataRequest", "ModelMetadataResponse", "metadata"),
    ("ModelInfer", "ModelInferRequest", "ModelInferResponse", "inference"),
    ("ModelConfig", "ModelConfigRequest", "ModelConfigResponse", "model-config"),
    ("ModelStatistics", "ModelStatisticsRequest", "ModelStatisticsResponse", "statistics"),
    ("RepositoryIndex", "RepositoryIndexRequest", "RepositoryIndexResponse", "model-repository"),
    (
        "RepositoryModelLoad",
        "RepositoryModelLoadRequest",
        "RepositoryModelLoadResponse",
        "model-repository",
    ),
    (
        "RepositoryModelUnload",
        "RepositoryModelUnloadRequest",
        "RepositoryModelUnloadResponse",
        "model-repository",
    ),
    *(
        (f"{kind}SharedMemory{verb}", f"{kind}SharedMemory{verb}Request",
         f"{kind}SharedMemory{verb}Response", "shared-memory")
        for kind in ("System", "Cuda")
        for verb in ("Status", "Register", "Unregister")
    ),
)  # fmt: skip
# The one streaming RPC: requests and responses both flow as streams.
STREAM_METHOD = ("ModelStreamInfer", "ModelInferRequest", "ModelStreamInferResponse", "inference")


def _parameters(owner: str, value: str = ".InferParameter") -> tuple[Any, Any]:
    """A ``map<string, value> parameters = 4``-style field's entry type and field."""
    return map_entry("ParametersEntry", value), f"{owner}.ParametersEntry"


def _name_version(name: str) -> descriptor_pb2.DescriptorProto:
    return message(name, [field(1, "name", "string"), field(2, "version", "string")])


def _duration(*names: str) -> list[descriptor_pb2.FieldDescriptorProto]:
    return [field(number, name, ".StatisticDuration") for number, name in enumerate(names, start=1)]


def _infer_messages() -> list[descriptor_pb2.DescriptorProto]:
    parameter = message(
        "InferParameter",
        [
            field(1, "bool_param", "bool", oneof=0),
            field(2, "int64_param", "int64", oneof=0),
            field(3, "string_param", "string", oneof=0),
            field(4, "double_param", "double", oneof=0),
            field(5, "uint64_param", "uint64", oneof=0),
        ],
        oneofs=("parameter_choice",),
    )
    contents = message(
        "InferTensorContents",
        [
            field(number, f"{kind}_contents", scalar, repeated=True)
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
    infer_request = message(
        "ModelInferRequest",
        [
            field(1, "model_name", "string"),
            field(2, "model_version", "string"),
            field(3, "id", "string"),
            field(4, "parameters", request_parameters, repeated=True),
            field(5, "inputs", f"{request}.InferInputTensor", repeated=True),
            field(6, "outputs", f"{request}.InferRequestedOutputTensor", repeated=True),
            field(7, "raw_input_contents", "bytes", repeated=True),
        ],
        nested=(
            message(
                "InferInputTensor",
                [
                    field(1, "name", "string"),
                    field(2, "datatype", "string"),
                    field(3, "shape", "int64", repeated=True),
                    field(4, "parameters", input_parameters, repeated=True),
                    field(5, "contents", ".InferTensorContents"),
                ],
                nested=(input_entry,),
            ),
            message(
                "InferRequestedOutputTensor",
                [
                    field(1, "name", "string"),
                    field(2, "parameters", output_parameters, repeated=True),
                ],
                nested=(output_entry,),
            ),
            request_entry,
        ),
    )
    response = ".ModelInferResponse"
    tensor_entry, tensor_parameters = _parameters(f"{response}.InferOutputTensor")
    response_entry, response_parameters = _parameters(response)
    infer_response = message(
        "ModelInferResponse",
        [
            field(1, "model_name", "string"),
            field(2, "model_version", "string"),
            field(3, "id", "string"),
            field(4, "parameters", response_parameters, repeated=True),
            field(5, "outputs", f"{response}.InferOutputTensor", repeated=True),
            field(6, "raw_output_contents", "bytes", repeated=True),
        ],
        nested=(
            message(
                "InferOutputTensor",
                [
                    field(1, "name", "string"),
                    field(2, "datatype", "string"),
                    field(3, "shape", "int64", repeated=True),
                    field(4, "parameters", tensor_parameters, repeated=True),
                    field(5, "contents", ".InferTensorContents"),
                ],
                nested=(tensor_entry,),
            ),
            response_entry,
        ),
    )
    stream_response = message(
        "ModelStreamInferResponse",
        [field(1, "error_message", "string"), field(2, "infer_response", ".ModelInferResponse")],
    )
    return [parameter, contents, infer_request, infer_response, stream_response]


def _statistics_messages() -> list[descriptor_pb2.DescriptorProto]:
    return [
        _name_version("ModelStatisticsRequest"),
        message("StatisticDuration", [field(1, "count", "uint64"), field(2, "ns", "uint64")]),
        message(
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
        message(
            "InferResponseStatistics",
            _duration(
                "compute_infer", "compute_output", "success", "fail", "empty_response", "cancel"
            ),
        ),
        message(
            "InferBatchStatistics",
            [
                field(1, "batch_size", "uint64"),
                *[
                    field(number, name, ".StatisticDuration")
                    for number, name in enumerate(
                        ("compute_input", "compute_infer", "compute_output"), start=2
                    )
                ],
            ],
        ),
        message(
            "MemoryUsage",
            [
                field(1, "type", "string"),
                field(2, "id", "int64"),
                field(3, "byte_size", "uint64"),
            ],
        ),
        message(
            "ModelStatistics",
            [
                field(1, "name", "string"),
                field(2, "version", "string"),
                field(3, "last_inference", "uint64"),
                field(4, "inference_count", "uint64"),
                field(5, "execution_count", "uint64"),
                field(6, "inference_stats", ".InferStatistics"),
                field(7, "batch_stats", ".InferBatchStatistics", repeated=True),
                field(8, "memory_usage", ".MemoryUsage", repeated=True),
                field(9, "response_stats", ".ModelStatistics.ResponseStatsEntry", repeated=True),
            ],
            nested=(map_entry("ResponseStatsEntry", ".InferResponseStatistics"),),
        ),
        message(
            "ModelStatisticsResponse",
            [field(1, "model_stats", ".ModelStatistics", repeated=True)],
        ),
    ]


def _repository_messages() -> list[descriptor_pb2.DescriptorProto]:
    parameter = message(
        "ModelRepositoryParameter",
        [
            field(1, "bool_param", "bool", oneof=0),
            field(2, "int64_param", "int64", oneof=0),
            field(3, "string_param", "string", oneof=0),
            field(4, "bytes_param", "bytes", oneof=0),
        ],
        oneofs=("parameter_choice",),
    )
    control = []
    for verb in ("Load", "Unload"):
        name = f"RepositoryModel{verb}Request"
        entry, parameters = _parameters(f".{name}", ".ModelRepositoryParameter")
        control.append(
            message(
                name,
                [
                    field(1, "repository_name", "string"),
                    field(2, "model_name", "string"),
                    field(3, "parameters", parameters, repeated=True),
                ],
                nested=(entry,),
            )
        )
        control.append(message(f"RepositoryModel{verb}Response", []))
    index = message(
        "RepositoryIndexResponse",
        [field(1, "models", ".RepositoryIndexResponse.ModelIndex", repeated=True)],
        nested=(
            message(
                "ModelIndex",
                [
                    field(1, "name", "string"),
                    field(2, "version", "string"),
                    field(3, "state", "string"),
                    field(4, "reason", "string"),
                ],
            ),
        ),
    )
    index_request = message(
        "RepositoryIndexRequest",
        [field(1, "repository_name", "string"), field(2, "ready", "bool")],
    )
    return [parameter, index_request, index, *control]


def _shared_memory_messages() -> list[descriptor_pb2.DescriptorProto]:
    """Triton's shared-memory extension: system and CUDA regions' status, register and
    unregister (a request naming no region means every one)."""
    system = ".SystemSharedMemoryStatusResponse"
    cuda = ".CudaSharedMemoryStatusResponse"
    return [
        _named("SystemSharedMemoryStatusRequest"),
        message(
            "SystemSharedMemoryStatusResponse",
            [field(1, "regions", f"{system}.RegionsEntry", repeated=True)],
            nested=(
                message(
                    "RegionStatus",
                    [
                        field(1, "name", "string"),
                        field(2, "key", "string"),
                        field(3, "offset", "uint64"),
                        field(4, "byte_size", "uint64"),
                    ],
                ),
                map_entry("RegionsEntry", f"{system}.RegionStatus"),
            ),
        ),
        message(
            "SystemSharedMemoryRegisterRequest",
            [
                field(1, "name", "string"),
                field(2, "key", "string"),
                field(3, "offset", "uint64"),
                field(4, "byte_size", "uint64"),
            ],
        ),
        message("SystemSharedMemoryRegisterResponse", []),
        _named("SystemSharedMemoryUnregisterRequest"),
        message("SystemSharedMemoryUnregisterResponse", []),
        _named("CudaSharedMemoryStatusRequest"),
        message(
            "CudaSharedMemoryStatusResponse",
            [field(1, "regions", f"{cuda}.RegionsEntry", repeated=True)],
            nested=(
                message(
                    "RegionStatus",
                    [
                        field(1, "name", "string"),
                        field(2, "device_id", "uint64"),
                        field(3, "byte_size", "uint64"),
                    ],
                ),
                map_entry("RegionsEntry", f"{cuda}.RegionStatus"),
            ),
        ),
        message(
            "CudaSharedMemoryRegisterRequest",
            [
                field(1, "name", "string"),
                field(2, "raw_handle", "bytes"),
                field(3, "device_id", "int64"),
                field(4, "byte_size", "uint64"),
            ],
        ),
        message("CudaSharedMemoryRegisterResponse", []),
        _named("CudaSharedMemoryUnregisterRequest"),
        message("CudaSharedMemoryUnregisterResponse", []),
    ]


def _named(name: str) -> descriptor_pb2.DescriptorProto:
    return message(name, [field(1, "name", "string")])


def _service_file() -> descriptor_pb2.FileDescriptorProto:
    metadata_entry = ".ModelMetadataResponse.TensorMetadata"
    messages = [
        message("ServerLiveRequest", []),
        message("ServerLiveResponse", [field(1, "live", "bool")]),
        message("ServerReadyRequest", []),
        message("ServerReadyResponse", [field(1, "ready", "bool")]),
        _name_version("ModelReadyRequest"),
        message("ModelReadyResponse", [field(1, "ready", "bool")]),
        message("ServerMetadataRequest", []),
        message(
            "ServerMetadataResponse",
            [
                field(1, "name", "string"),
                field(2, "version", "string"),
                field(3, "extensions", "string", repeated=True),
            ],
        ),
        _name_version("ModelMetadataRequest"),
        message(
            "ModelMetadataResponse",
            [
                field(1, "name", "string"),
                field(2, "versions", "string", repeated=True),
                field(3, "platform", "string"),
                field(4, "inputs", metadata_entry, repeated=True),
                field(5, "outputs", metadata_entry, repeated=True),
            ],
            nested=(
                message(
                    "TensorMetadata",
                    [
                        field(1, "name", "string"),
                        field(2, "datatype", "string"),
                        field(3, "shape", "int64", repeated=True),
                    ],
                ),
            ),
        ),
        *_infer_messages(),
        _name_version("ModelConfigRequest"),
        message("ModelConfigResponse", [field(1, "config", ".ModelConfig")]),
        *_statistics_messages(),
        *_repository_messages(),
        *_shared_memory_messages(),
    ]
    schema = descriptor_pb2.FileDescriptorProto(
        name="reposerve/triton_grpc_service.proto",
        package=PACKAGE,
        syntax="proto3",
        dependency=[triton_schema.FILE_NAME],
    )
    schema.message_type.extend(messages)
    service = schema.service.add(name="GRPCInferenceService")
    for method, request, response, _ in METHODS:
        service.method.add(
            name=method, input_type=f".{PACKAGE}.{request}", output_type=f".{PACKAGE}.{response}"
        )
    method, request, response, _ = STREAM_METHOD
    service.method.add(
        name=method,
        input_type=f".{PACKAGE}.{request}",
        output_type=f".{PACKAGE}.{response}",
        client_streaming=True,
        server_streaming=True,
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
def message_class(full_name: str) -> Any:
    """The message class of ``full_name`` (e.g. ``inference.ModelInferRequest``)."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))
