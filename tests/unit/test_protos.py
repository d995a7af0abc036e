"""The schemas compiled from reposerve's ``.proto`` files.

The committed descriptor modules are what the ``.proto`` files compile to, and every
message, field (number, label, type, type name, oneof, JSON name), enum value and call of
ours is Triton's, as tritonclient ships its published schema (``model_config_pb2``,
``service_pb2``, ``service_pb2_grpc``). What Triton has and ours leaves out is named here,
so that leaving out more, or a Triton release adding to its schema, is a decision this test
shows rather than a difference nothing sees.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool

from reposerve.config import model_config_descriptor
from reposerve.config.triton_schema import model_config_class
from reposerve.grpc import schema

pytestmark = pytest.mark.unit

model_config_pb2 = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] is not installed"
)
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

# Triton's ModelConfig messages, fields and enums that reposerve has no equivalent for: a
# config.pbtxt or JSON config setting one is refused, naming it (tests/unit/test_pbtxt.py).
MODEL_CONFIG_LEFT_OUT = {
    # Whole messages: batch tensors, model operations, the rate limiter, repository agents,
    # the response cache.
    "inference.BatchInput",
    "inference.BatchOutput",
    "inference.ModelOperations",
    "inference.ModelRateLimiter",
    "inference.ModelRepositoryAgents",
    "inference.ModelResponseCache",
    # ModelConfig's fields that hold them, and the rest it has no use for.
    "inference.ModelConfig.batch_input",
    "inference.ModelConfig.batch_output",
    "inference.ModelConfig.cc_model_filenames",
    "inference.ModelConfig.metric_tags",
    "inference.ModelConfig.model_operations",
    "inference.ModelConfig.model_repository_agents",
    "inference.ModelConfig.response_cache",
    "inference.ModelConfig.runtime",
    "inference.ModelDynamicBatching.priority_queue_policy",
    "inference.ModelInput.is_non_linear_format_io",
    "inference.ModelOutput.is_non_linear_format_io",
    # Instance placement beyond kind, count and GPUs.
    "inference.ModelInstanceGroup.SecondaryDevice",
    "inference.ModelInstanceGroup.host_policy",
    "inference.ModelInstanceGroup.passive",
    "inference.ModelInstanceGroup.profile",
    "inference.ModelInstanceGroup.rate_limiter",
    "inference.ModelInstanceGroup.secondary_devices",
    # Triton's own optimization knobs; execution accelerators are read (as onnxruntime
    # options).
    "inference.ModelOptimizationPolicy.Cuda",
    "inference.ModelOptimizationPolicy.Graph",
    "inference.ModelOptimizationPolicy.ModelPriority",
    "inference.ModelOptimizationPolicy.PinnedMemoryBuffer",
    "inference.ModelOptimizationPolicy.cuda",
    "inference.ModelOptimizationPolicy.eager_batching",
    "inference.ModelOptimizationPolicy.gather_kernel_buffer_threshold",
    "inference.ModelOptimizationPolicy.graph",
    "inference.ModelOptimizationPolicy.input_pinned_memory",
    "inference.ModelOptimizationPolicy.output_pinned_memory",
    "inference.ModelOptimizationPolicy.priority",
}
# Triton's trace and log settings calls, which reposerve does not serve, and their messages.
CALLS_LEFT_OUT = {"TraceSetting", "LogSettings"}
SERVICE_LEFT_OUT = {
    f"inference.{call}{kind}" for call in CALLS_LEFT_OUT for kind in ("Request", "Response")
}


class Comparison(msgspec.Struct):
    """What comparing our declarations with Triton's found: how many were compared, and
    Triton's messages, enums and fields that ours leaves out, by full name."""

    messages: int = 0
    fields: int = 0
    enum_values: int = 0
    left_out: set[str] = msgspec.field(default_factory=set)


def _compare_file(ours: descriptor.FileDescriptor, theirs: Any) -> Comparison:
    assert ours.package == theirs.package
    found = Comparison()
    _compare_members(ours, theirs, found)
    return found


def _compare_members(ours: Any, theirs: Any, found: Comparison) -> None:
    """The messages and enums declared in ``ours`` (a file or a message) against those of
    ``theirs`` by name. Triton's map entry types are left out with the map field."""
    for members, compare in ((_messages_in, _compare_message), (_enums_in, _compare_enum)):
        mine, their = members(ours), members(theirs)
        for name, member in mine.items():
            assert name in their, f"{member.full_name} is not Triton's"
            compare(member, their[name], found)
        left_out = (their[name] for name in set(their) - set(mine))
        found.left_out |= {
            member.full_name
            for member in left_out
            if not (members is _messages_in and member.GetOptions().map_entry)
        }


def _messages_in(owner: Any) -> dict[str, Any]:
    if isinstance(owner, descriptor.FileDescriptor):
        return dict(owner.message_types_by_name)
    return dict(owner.nested_types_by_name)


def _enums_in(owner: Any) -> dict[str, Any]:
    return dict(owner.enum_types_by_name)


def _compare_message(ours: descriptor.Descriptor, theirs: Any, found: Comparison) -> None:
    assert ours.GetOptions().map_entry == theirs.GetOptions().map_entry, ours.full_name
    their_fields = _field_specs(theirs)
    for name, spec in _field_specs(ours).items():
        assert name in their_fields, f"{ours.full_name}.{name} is not Triton's"
        assert spec == their_fields[name], f"{ours.full_name}.{name}"
        found.fields += 1
    found.left_out |= {
        f"{ours.full_name}.{name}" for name in set(their_fields) - set(ours.fields_by_name)
    }
    found.messages += 1
    _compare_members(ours, theirs, found)


def _field_specs(message: Any) -> dict[str, tuple[descriptor_pb2.FieldDescriptorProto, str, str]]:
    """Each field's declaration as its descriptor proto holds it (number, label, type, type
    name, options), with its oneof by name rather than position, and its JSON name as the
    runtime derives it (a proto carries one only where protoc was asked to write it)."""
    declared = descriptor_pb2.DescriptorProto()
    message.CopyToProto(declared)
    specs = {}
    for field in declared.field:
        oneof = declared.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else ""
        json_name = message.fields_by_name[field.name].json_name
        field.ClearField("oneof_index")
        field.ClearField("json_name")
        specs[field.name] = (field, oneof, json_name)
    return specs


def _compare_enum(ours: descriptor.EnumDescriptor, theirs: Any, found: Comparison) -> None:
    assert _values(ours) == _values(theirs), ours.full_name
    found.enum_values += len(ours.values)


def _values(enum: Any) -> list[tuple[str, int]]:
    return [(value.name, value.number) for value in enum.values]


def test_model_config_is_tritons_but_for_what_reposerve_has_no_equivalent_for():
    found = _compare_file(model_config_class().DESCRIPTOR.file, model_config_pb2.DESCRIPTOR)
    assert found.left_out == MODEL_CONFIG_LEFT_OUT
    assert (found.messages, found.fields, found.enum_values) == (32, 113, 28)


def test_grpc_messages_are_tritons_but_for_the_trace_and_log_settings():
    ours = schema.pool().FindFileByName("reposerve/grpc/grpc_service.proto")
    found = _compare_file(ours, service_pb2.DESCRIPTOR)
    assert found.left_out == SERVICE_LEFT_OUT
    assert (found.messages, found.fields) == (61, 154)


def _call(method: Any) -> tuple[str, str, bool, bool]:
    return (
        method.input_type.full_name,
        method.output_type.full_name,
        method.client_streaming,
        method.server_streaming,
    )


def test_grpc_calls_are_tritons_each_with_its_protocol_category():
    ours = schema.pool().FindServiceByName(schema.SERVICE)
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in ours.methods:
        assert _call(method) == _call(theirs.methods_by_name[method.name]), method.name
    assert set(theirs.methods_by_name) - set(ours.methods_by_name) == CALLS_LEFT_OUT
    assert len(ours.methods) == 18  # with the shared-memory extension's six
    assert set(schema.CATEGORIES) == set(ours.methods_by_name)


class RecordingChannel:
    """A channel that records the calls a generated stub binds: their path, the kind of
    call and the response message its deserializer makes."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[str, str]] = {}

    def unary_unary(self, path: str, **options: Any) -> None:
        self._record("unary_unary", path, **options)

    def stream_stream(self, path: str, **options: Any) -> None:
        self._record("stream_stream", path, **options)

    def _record(self, kind: str, path: str, response_deserializer: Any, **_: Any) -> None:
        self.calls[path] = (kind, response_deserializer.__self__.DESCRIPTOR.full_name)


def test_tritonclients_stub_calls_are_served_here_on_their_paths():
    """The paths tritonclient's generated stub calls, with their kind and response, are
    the calls the server registers (``schema.METHODS`` and ``STREAM_METHOD``)."""
    channel = RecordingChannel()
    service_pb2_grpc.GRPCInferenceServiceStub(channel)
    served = {
        f"/{schema.SERVICE}/{method}": ("unary_unary", f"{schema.PACKAGE}.{response}")
        for method, _, response, _ in schema.METHODS
    }
    method, _, response, _ = schema.STREAM_METHOD
    served[f"/{schema.SERVICE}/{method}"] = ("stream_stream", f"{schema.PACKAGE}.{response}")
    left_out = {f"/{schema.SERVICE}/{call}" for call in CALLS_LEFT_OUT}
    assert {path: call for path, call in channel.calls.items() if path not in left_out} == served
    assert left_out <= set(channel.calls)


def test_the_descriptor_modules_are_what_the_protos_compile_to():
    """``python -m tools.protos`` has been run since the last change to a ``.proto``, and no
    descriptor module outlives its ``.proto``."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools (a test dependency) is not installed")
    from tools import protos

    expected = protos.generated()
    committed = set((protos.ROOT / "reposerve").rglob(f"*{protos.SUFFIX}"))
    assert committed == set(expected)
    stale = [
        str(path.relative_to(protos.ROOT))
        for path, text in expected.items()
        if path.read_text() != text
    ]
    assert stale == [], "run `python -m tools.protos` and commit what it writes"
    assert len(expected) == len(protos.sources()) == 3


def test_a_changed_proto_compiles_to_a_different_module(tmp_path, monkeypatch):
    """The check above can fail: a field added to a ``.proto`` changes what it compiles to."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools (a test dependency) is not installed")
    from tools import protos

    health = protos.ROOT / "reposerve" / "grpc" / "health.proto"
    changed = tmp_path / "reposerve" / "grpc" / "health.proto"
    changed.parent.mkdir(parents=True)
    changed.write_text(health.read_text().replace("= 1;\n}", "= 1;\n  string extra = 2;\n}", 1))
    monkeypatch.setattr(protos, "ROOT", tmp_path)
    (module,) = protos.generated().values()
    assert module != (health.parent / "health_descriptor.py").read_text()


@pytest.mark.parametrize(
    "change",
    [
        {"number": 2},
        {"type": descriptor_pb2.FieldDescriptorProto.TYPE_INT32},
        {"label": descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL},
        {"json_name": "reshapeShape"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_field_declared_unlike_tritons_fails_the_comparison(change):
    """The comparison can fail: ``ModelTensorReshape.shape`` (``repeated int64 shape = 1``)
    changed in one respect is no longer Triton's."""
    file = descriptor_pb2.FileDescriptorProto.FromString(model_config_descriptor.FILE)
    (reshape,) = (message for message in file.message_type if message.name == "ModelTensorReshape")
    for key, value in change.items():
        setattr(reshape.field[0], key, value)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    with pytest.raises(AssertionError, match="inference.ModelTensorReshape.shape"):
        _compare_file(pool.FindFileByName(file.name), model_config_pb2.DESCRIPTOR)
