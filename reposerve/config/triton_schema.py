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


def field(number: int, name: str, kind: str, repeated: bool = False, oneof: int = -1) -> _F:
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


def message(
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


def map_entry(name: str, value_kind: str) -> descriptor_pb2.DescriptorProto:
    """A protobuf map<string, value> is a repeated message of this shape."""
    entry = message(name, [field(1, "key", "string"), field(2, "value", value_kind)])
    entry.options.map_entry = True
    return entry


def enum(name: str, *values: str) -> descriptor_pb2.EnumDescriptorProto:
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
    reshape = message("ModelTensorReshape", [field(1, "shape", "int64", repeated=True)])
    model_input = message(
        "ModelInput",
        [
            field(1, "name", "string"),
            field(2, "data_type", "enum:.DataType"),
            field(3, "format", "enum:.ModelInput.Format"),
            field(4, "dims", "int64", repeated=True),
            field(5, "reshape", ".ModelTensorReshape"),
            field(6, "is_shape_tensor", "bool"),
            field(7, "allow_ragged_batch", "bool"),
            field(8, "optional", "bool"),
        ],
        enums=(enum("Format", "FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"),),
    )
    model_output = message(
        "ModelOutput",
        [
            field(1, "name", "string"),
            field(2, "data_type", "enum:.DataType"),
            field(3, "dims", "int64", repeated=True),
            field(4, "label_filename", "string"),
            field(5, "reshape", ".ModelTensorReshape"),
            field(6, "is_shape_tensor", "bool"),
        ],
    )
    version_policy = message(
        "ModelVersionPolicy",
        [
            field(1, "latest", ".ModelVersionPolicy.Latest", oneof=0),
            field(2, "all", ".ModelVersionPolicy.All", oneof=0),
            field(3, "specific", ".ModelVersionPolicy.Specific", oneof=0),
        ],
        nested=(
            message("Latest", [field(1, "num_versions", "uint32")]),
            message("All", []),
            message("Specific", [field(1, "versions", "int64", repeated=True)]),
        ),
        oneofs=("policy_choice",),
    )
    instance_group = message(
        "ModelInstanceGroup",
        [
            field(1, "name", "string"),
            field(2, "count", "int32"),
            field(3, "gpus", "int32", repeated=True),
            field(4, "kind", "enum:.ModelInstanceGroup.Kind"),
        ],
        enums=(enum("Kind", "KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"),),
    )
    queue_policy = message(
        "ModelQueuePolicy",
        [
            field(1, "timeout_action", "enum:.ModelQueuePolicy.TimeoutAction"),
            field(2, "default_timeout_microseconds", "uint64"),
            field(3, "allow_timeout_override", "bool"),
            field(4, "max_queue_size", "uint32"),
        ],
        enums=(enum("TimeoutAction", "REJECT", "DELAY"),),
    )
    dynamic_batching = message(
        "ModelDynamicBatching",
        [
            field(1, "preferred_batch_size", "int32", repeated=True),
            field(2, "max_queue_delay_microseconds", "uint64"),
            field(3, "preserve_ordering", "bool"),
            field(4, "priority_levels", "uint64"),
            field(5, "default_priority_level", "uint64"),
            field(6, "default_queue_policy", ".ModelQueuePolicy"),
        ],
    )
    sequence_batching = message(
        "ModelSequenceBatching",
        [
            field(1, "max_sequence_idle_microseconds", "uint64"),
            field(2, "control_input", ".ModelSequenceBatching.ControlInput", repeated=True),
            field(3, "direct", ".ModelSequenceBatching.StrategyDirect", oneof=0),
            field(4, "oldest", ".ModelSequenceBatching.StrategyOldest", oneof=0),
            field(5, "state", ".ModelSequenceBatching.State", repeated=True),
            field(6, "iterative_sequence", "bool"),
        ],
        nested=(
            message(
                "Control",
                [
                    field(1, "kind", "enum:.ModelSequenceBatching.Control.Kind"),
                    field(2, "int32_false_true", "int32", repeated=True),
                    field(3, "fp32_false_true", "float", repeated=True),
                    field(4, "data_type", "enum:.DataType"),
                    field(5, "bool_false_true", "bool", repeated=True),
                ],
                enums=(
                    enum(
                        "Kind",
                        "CONTROL_SEQUENCE_START",
                        "CONTROL_SEQUENCE_READY",
                        "CONTROL_SEQUENCE_END",
                        "CONTROL_SEQUENCE_CORRID",
                    ),
                ),
            ),
            message(
                "ControlInput",
                [
                    field(1, "name", "string"),
                    field(2, "control", ".ModelSequenceBatching.Control", repeated=True),
                ],
            ),
            message(
                "InitialState",
                [
                    field(1, "data_type", "enum:.DataType"),
                    field(2, "dims", "int64", repeated=True),
                    field(3, "zero_data", "bool", oneof=0),
                    field(4, "data_file", "string", oneof=0),
                    field(5, "name", "string"),
                ],
                oneofs=("state_data",),
            ),
            message(
                "State",
                [
                    field(1, "input_name", "string"),
                    field(2, "output_name", "string"),
                    field(3, "data_type", "enum:.DataType"),
                    field(4, "dims", "int64", repeated=True),
                    field(5, "initial_state", ".ModelSequenceBatching.InitialState", repeated=True),
                    field(6, "use_same_buffer_for_input_output", "bool"),
                    field(7, "use_growable_memory", "bool"),
                ],
            ),
            message(
                "StrategyDirect",
                [
                    field(1, "max_queue_delay_microseconds", "uint64"),
                    field(2, "minimum_slot_utilization", "float"),
                ],
            ),
            message(
                "StrategyOldest",
                [
                    field(1, "max_candidate_sequences", "int32"),
                    field(2, "preferred_batch_size", "int32", repeated=True),
                    field(3, "max_queue_delay_microseconds", "uint64"),
                    field(4, "preserve_ordering", "bool"),
                ],
            ),
        ),
        oneofs=("strategy_choice",),
    )
    accelerator = message(
        "Accelerator",
        [
            field(1, "name", "string"),
            field(
                2,
                "parameters",
                ".ModelOptimizationPolicy.ExecutionAccelerators.Accelerator.ParametersEntry",
                repeated=True,
            ),
        ],
        nested=(map_entry("ParametersEntry", "string"),),
    )
    accelerators = ".ModelOptimizationPolicy.ExecutionAccelerators.Accelerator"
    optimization = message(
        "ModelOptimizationPolicy",
        [
            field(4, "execution_accelerators", ".ModelOptimizationPolicy.ExecutionAccelerators"),
        ],
        nested=(
            message(
                "ExecutionAccelerators",
                [
                    field(1, "gpu_execution_accelerator", accelerators, repeated=True),
                    field(2, "cpu_execution_accelerator", accelerators, repeated=True),
                ],
                nested=(accelerator,),
            ),
        ),
    )
    warmup = message(
        "ModelWarmup",
        [
            field(1, "name", "string"),
            field(2, "batch_size", "uint32"),
            field(3, "inputs", ".ModelWarmup.InputsEntry", repeated=True),
            field(4, "count", "uint32"),
        ],
        nested=(
            message(
                "Input",
                [
                    field(1, "data_type", "enum:.DataType"),
                    field(2, "dims", "int64", repeated=True),
                    field(3, "zero_data", "bool", oneof=0),
                    field(4, "random_data", "bool", oneof=0),
                    field(5, "input_data_file", "string", oneof=0),
                ],
                oneofs=("input_data_type",),
            ),
            map_entry("InputsEntry", ".ModelWarmup.Input"),
        ),
    )
    parameter = message("ModelParameter", [field(1, "string_value", "string")])
    transaction_policy = message("ModelTransactionPolicy", [field(1, "decoupled", "bool")])
    step = ".ModelEnsembling.Step"
    ensembling = message(
        "ModelEnsembling",
        [field(1, "step", step, repeated=True)],
        nested=(
            message(
                "Step",
                [
                    field(1, "model_name", "string"),
                    field(2, "model_version", "int64"),
                    field(3, "input_map", f"{step}.InputMapEntry", repeated=True),
                    field(4, "output_map", f"{step}.OutputMapEntry", repeated=True),
                    field(5, "model_namespace", "string"),
                ],
                nested=(
                    map_entry("InputMapEntry", "string"),
                    map_entry("OutputMapEntry", "string"),
                ),
            ),
        ),
    )
    model_config = message(
        "ModelConfig",
        [
            field(1, "name", "string"),
            field(2, "platform", "string"),
            field(3, "version_policy", ".ModelVersionPolicy"),
            field(4, "max_batch_size", "int32"),
            field(5, "input", ".ModelInput", repeated=True),
            field(6, "output", ".ModelOutput", repeated=True),
            field(7, "instance_group", ".ModelInstanceGroup", repeated=True),
            field(8, "default_model_filename", "string"),
            field(11, "dynamic_batching", ".ModelDynamicBatching", oneof=0),
            field(12, "optimization", ".ModelOptimizationPolicy"),
            field(13, "sequence_batching", ".ModelSequenceBatching", oneof=0),
            field(14, "parameters", ".ModelConfig.ParametersEntry", repeated=True),
            field(15, "ensemble_scheduling", ".ModelEnsembling", oneof=0),
            field(16, "model_warmup", ".ModelWarmup", repeated=True),
            field(17, "backend", "string"),
            field(19, "model_transaction_policy", ".ModelTransactionPolicy"),
        ],
        nested=(map_entry("ParametersEntry", ".ModelParameter"),),
        oneofs=("scheduling_choice",),
    )
    schema = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package=PACKAGE, syntax="proto3")
    schema.enum_type.append(enum("DataType", *DATA_TYPES))
    schema.message_type.extend(
        [
            reshape, model_input, model_output, version_policy, instance_group, queue_policy,
            dynamic_batching, sequence_batching, optimization, warmup, parameter,
            transaction_policy, ensembling, model_config,
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
