"""The part of Triton's ``ModelConfig`` protobuf that reposerve reads, declared here.

Written from Triton's published model-configuration documentation: message, field and enum
names and field numbers are Triton's (so ``config.pbtxt`` files and the wire format agree),
the selection is ours. A field left out here is one reposerve has no equivalent for; the
text-format parser rejects it, and ``pbtxt`` turns that into an error naming the field.

The schema is built at run time into a private descriptor pool rather than compiled with
protoc: no generated code, so no coupling between protoc's and the runtime's versions, and
no clash with a ``model_config.proto`` another library (tritonclient) registers.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _F.TYPE_STRING,
    "bool": _F.TYPE_BOOL,
    "int32": _F.TYPE_INT32,
    "uint32": _F.TYPE_UINT32,
    "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64,
    "float": _F.TYPE_FLOAT,
    "double": _F.TYPE_DOUBLE,
    "bytes": _F.TYPE_BYTES,
}


def _field(number: int, name: str, kind: str, repeated: bool = False, oneof: int = -1) -> _F:
    """``kind``: a scalar name, ``.Message`` / ``.Message.Nested``, or ``enum:.Enum``."""
    field = _F(name=name, number=number, json_name=_json_name(name))
    field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if kind in _SCALARS:
        field.type = _SCALARS[kind]
    elif kind.startswith("enum:"):
        field.type = _F.TYPE_ENUM
        field.type_name = f".{PACKAGE}{kind[5:]}"
    else:
        field.type = _F.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}{kind}"
    if oneof >= 0:
        field.oneof_index = oneof
    return field


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _message(
    name: str,
    fields: list[_F],
    nested: tuple[descriptor_pb2.DescriptorProto, ...] = (),
    enums: tuple[descriptor_pb2.EnumDescriptorProto, ...] = (),
    oneofs: tuple[str, ...] = (),
) -> descriptor_pb2.DescriptorProto:
    message = descriptor_pb2.DescriptorProto(name=name, field=fields)
    message.nested_type.extend(nested)
    message.enum_type.extend(enums)
    message.oneof_decl.extend(descriptor_pb2.OneofDescriptorProto(name=n) for n in oneofs)
    return message


def _map_entry(name: str, value_kind: str) -> descriptor_pb2.DescriptorProto:
    """A protobuf map<string, value> is a repeated message of this shape."""
    entry = _message(name, [_field(1, "key", "string"), _field(2, "value", value_kind)])
    entry.options.map_entry = True
    return entry


def _enum(name: str, *values: str) -> descriptor_pb2.EnumDescriptorProto:
    return descriptor_pb2.EnumDescriptorProto(
        name=name,
        value=[
            descriptor_pb2.EnumValueDescriptorProto(name=value, number=number)
            for number, value in enumerate(values)
        ],
    )


DATA_TYPES = (
    "TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
    "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32",
    "TYPE_FP64", "TYPE_STRING", "TYPE_BF16",
)  # fmt: skip


def _file() -> descriptor_pb2.FileDescriptorProto:
    reshape = _message("ModelTensorReshape", [_field(1, "shape", "int64", repeated=True)])
    model_input = _message(
        "ModelInput",
        [
            _field(1, "name", "string"),
            _field(2, "data_type", "enum:.DataType"),
            _field(3, "format", "enum:.ModelInput.Format"),
            _field(4, "dims", "int64", repeated=True),
            _field(5, "reshape", ".ModelTensorReshape"),
            _field(6, "is_shape_tensor", "bool"),
            _field(7, "allow_ragged_batch", "bool"),
            _field(8, "optional", "bool"),
        ],
        enums=(_enum("Format", "FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"),),
    )
    model_output = _message(
        "ModelOutput",
        [
            _field(1, "name", "string"),
            _field(2, "data_type", "enum:.DataType"),
            _field(3, "dims", "int64", repeated=True),
            _field(4, "label_filename", "string"),
            _field(5, "reshape", ".ModelTensorReshape"),
            _field(6, "is_shape_tensor", "bool"),
        ],
    )
    version_policy = _message(
        "ModelVersionPolicy",
        [
            _field(1, "latest", ".ModelVersionPolicy.Latest", oneof=0),
            _field(2, "all", ".ModelVersionPolicy.All", oneof=0),
            _field(3, "specific", ".ModelVersionPolicy.Specific", oneof=0),
        ],
        nested=(
            _message("Latest", [_field(1, "num_versions", "uint32")]),
            _message("All", []),
            _message("Specific", [_field(1, "versions", "int64", repeated=True)]),
        ),
        oneofs=("policy_choice",),
    )
    instance_group = _message(
        "ModelInstanceGroup",
        [
            _field(1, "name", "string"),
            _field(2, "count", "int32"),
            _field(3, "gpus", "int32", repeated=True),
            _field(4, "kind", "enum:.ModelInstanceGroup.Kind"),
        ],
        enums=(_enum("Kind", "KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"),),
    )
    queue_policy = _message(
        "ModelQueuePolicy",
        [
            _field(1, "timeout_action", "enum:.ModelQueuePolicy.TimeoutAction"),
            _field(2, "default_timeout_microseconds", "uint64"),
            _field(3, "allow_timeout_override", "bool"),
            _field(4, "max_queue_size", "uint32"),
        ],
        enums=(_enum("TimeoutAction", "REJECT", "DELAY"),),
    )
    dynamic_batching = _message(
        "ModelDynamicBatching",
        [
            _field(1, "preferred_batch_size", "int32", repeated=True),
            _field(2, "max_queue_delay_microseconds", "uint64"),
            _field(3, "preserve_ordering", "bool"),
            _field(4, "priority_levels", "uint64"),
            _field(5, "default_priority_level", "uint64"),
            _field(6, "default_queue_policy", ".ModelQueuePolicy"),
        ],
    )
    accelerator = _message(
        "Accelerator",
        [
            _field(1, "name", "string"),
            _field(
                2,
                "parameters",
                ".ModelOptimizationPolicy.ExecutionAccelerators.Accelerator.ParametersEntry",
                repeated=True,
            ),
        ],
        nested=(_map_entry("ParametersEntry", "string"),),
    )
    accelerators = ".ModelOptimizationPolicy.ExecutionAccelerators.Accelerator"
    optimization = _message(
        "ModelOptimizationPolicy",
        [
            _field(4, "execution_accelerators", ".ModelOptimizationPolicy.ExecutionAccelerators"),
        ],
        nested=(
            _message(
                "ExecutionAccelerators",
                [
                    _field(1, "gpu_execution_accelerator", accelerators, repeated=True),
                    _field(2, "cpu_execution_accelerator", accelerators, repeated=True),
                ],
                nested=(accelerator,),
            ),
        ),
    )
    warmup = _message(
        "ModelWarmup",
        [
            _field(1, "name", "string"),
            _field(2, "batch_size", "uint32"),
            _field(3, "inputs", ".ModelWarmup.InputsEntry", repeated=True),
            _field(4, "count", "uint32"),
        ],
        nested=(
            _message(
                "Input",
                [
                    _field(1, "data_type", "enum:.DataType"),
                    _field(2, "dims", "int64", repeated=True),
                    _field(3, "zero_data", "bool", oneof=0),
                    _field(4, "random_data", "bool", oneof=0),
                    _field(5, "input_data_file", "string", oneof=0),
                ],
                oneofs=("input_data_type",),
            ),
            _map_entry("InputsEntry", ".ModelWarmup.Input"),
        ),
    )
    parameter = _message("ModelParameter", [_field(1, "string_value", "string")])
    transaction_policy = _message("ModelTransactionPolicy", [_field(1, "decoupled", "bool")])
    model_config = _message(
        "ModelConfig",
        [
            _field(1, "name", "string"),
            _field(2, "platform", "string"),
            _field(3, "version_policy", ".ModelVersionPolicy"),
            _field(4, "max_batch_size", "int32"),
            _field(5, "input", ".ModelInput", repeated=True),
            _field(6, "output", ".ModelOutput", repeated=True),
            _field(7, "instance_group", ".ModelInstanceGroup", repeated=True),
            _field(8, "default_model_filename", "string"),
            _field(11, "dynamic_batching", ".ModelDynamicBatching", oneof=0),
            _field(12, "optimization", ".ModelOptimizationPolicy"),
            _field(14, "parameters", ".ModelConfig.ParametersEntry", repeated=True),
            _field(16, "model_warmup", ".ModelWarmup", repeated=True),
            _field(17, "backend", "string"),
            _field(19, "model_transaction_policy", ".ModelTransactionPolicy"),
        ],
        nested=(_map_entry("ParametersEntry", ".ModelParameter"),),
        oneofs=("scheduling_choice",),
    )
    schema = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package=PACKAGE, syntax="proto3")
    schema.enum_type.append(_enum("DataType", *DATA_TYPES))
    schema.message_type.extend(
        [
            reshape, model_input, model_output, version_policy, instance_group, queue_policy,
            dynamic_batching, optimization, warmup, parameter, transaction_policy, model_config,
        ]
    )  # fmt: skip
    return schema


FILE_NAME = "reposerve/triton_model_config.proto"


def file_proto() -> descriptor_pb2.FileDescriptorProto:
    """The declaration, for a pool that builds other messages on ModelConfig (gRPC)."""
    return _file()


@functools.cache
def model_config_class() -> Any:
    """The message class of ``inference.ModelConfig`` as declared here."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.ModelConfig"))
