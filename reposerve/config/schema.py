"""The config.toml schema (DESIGN.md §2) as frozen msgspec Structs.

Unknown keys are errors (``forbid_unknown_fields``) so a typo never silently falls back to
a default. Constraints that one field can express live in ``Meta``; rules that span fields
live in ``reposerve.config.load``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from msgspec import Meta

from reposerve.config.backends import NAMES

NonNegative = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]
Dim = Annotated[int, Meta(ge=-1)]
ModelName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]*$")]
Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
]  # fmt: skip
if TYPE_CHECKING:  # the names are known when the entries are: msgspec checks them
    Backend = str
else:
    Backend = Literal[NAMES]  # one per entry of reposerve.config.backends


# Subclasses repeat ``frozen=True``: msgspec inherits it, but a type checker reads each
# class's own keywords only (PEP 681's dataclass_transform).
class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class TensorConfig(_Section, frozen=True):
    name: Annotated[str, Meta(min_length=1)]
    datatype: Datatype
    shape: list[Dim]
    # Triton's reshape: the shape the model itself takes or gives (batch dimension excluded
    # when batching), where ``shape`` is the one clients see. None: the model sees ``shape``.
    reshape: list[Dim] | None = None
    optional: bool = False
    # Outputs only: a file in the model folder, one class label per line, for Triton's
    # classification extension (an output requested with parameters.classification).
    label_filename: str | None = None


class VersionPolicy(_Section, frozen=True):
    """Exactly one of the three Triton policies; an empty table means ``latest = 1``."""

    latest: Positive | None = None
    all: bool | None = None
    specific: Annotated[list[Positive], Meta(min_length=1)] | None = None


class InstanceGroup(_Section, frozen=True):
    # "model": Triton's KIND_MODEL, the model picks its device itself; reposerve runs the
    # instance as a CPU one that still sees every GPU (no CUDA_VISIBLE_DEVICES of its own).
    kind: Literal["cpu", "gpu", "auto", "model"] = "cpu"
    count: Positive = 1
    gpus: list[NonNegative] | None = None  # None = every visible GPU
    # Cores the group's instance processes are pinned to (None = wherever the server runs).
    cpus: Annotated[list[NonNegative], Meta(min_length=1)] | None = None


class DynamicBatching(_Section, frozen=True):
    preferred_batch_size: list[Positive] = []
    max_queue_delay_microseconds: NonNegative = 0
    max_queue_size: NonNegative = 0
    default_timeout_microseconds: NonNegative = 0
    preserve_ordering: bool = False
    priority_levels: NonNegative = 0
    default_priority_level: NonNegative = 0
    # Variable-length batching (reposerve's, config/padding.py): requests whose -1 dims
    # differ share a batch, padded to the longest in it or to the next of ``buckets``.
    pad: dict[str, int | float] = {}  # input -> the value it is padded with
    buckets: list[Positive] = []
    lengths_input: Annotated[str, Meta(min_length=1)] | None = None  # each request's length
    lengths_datatype: Literal["INT32", "INT64"] = "INT32"
    unpad: dict[str, str] = {}  # output -> the padded input whose length it is cut back to


class ControlInput(_Section, frozen=True):
    """An input the sequence batcher fills for the model (Triton's ``control_input``):
    whether the request starts or ends its sequence, whether it holds a request at all,
    or the sequence's correlation id."""

    name: Annotated[str, Meta(min_length=1)]
    kind: Literal["start", "end", "ready", "corrid"]
    # start/end/ready: INT32, FP32 or BOOL; corrid: UINT64, INT64, UINT32, INT32 or BYTES
    datatype: Datatype = "INT32"
    # start/end/ready: the values meaning false and true (Triton's int32_false_true, ...)
    false_true: Annotated[list[bool | int | float], Meta(min_length=2, max_length=2)] | None = None


class InitialState(_Section, frozen=True):
    """What a sequence's state holds on its first request: zeros, or a file of the model
    folder's ``initial_state/`` (raw values, row-major)."""

    datatype: Datatype
    shape: list[NonNegative]
    data_file: str | None = None


class SequenceState(_Section, frozen=True):
    """Implicit state: the model's ``output_name`` of one request of a sequence is fed back
    as its ``input_name`` on the next; the server keeps it in between."""

    input_name: Annotated[str, Meta(min_length=1)]
    output_name: Annotated[str, Meta(min_length=1)]
    datatype: Datatype
    shape: list[Dim]
    initial_state: InitialState | None = None


class SequenceBatching(_Section, frozen=True):
    """Stateful models (Triton's ``sequence_batching``): the requests of one sequence (one
    correlation id) run in order, one at a time, on one instance."""

    # direct: each sequence owns one of an instance's max_batch_size slots; oldest: up to
    # max_candidate_sequences per instance, batched by the oldest ready requests.
    strategy: Literal["direct", "oldest"] = "direct"
    # A sequence with no request for this long is released (Triton's default: 1 s).
    max_sequence_idle_microseconds: Positive = 1_000_000
    max_candidate_sequences: Positive | None = None  # oldest; None: max_batch_size
    preferred_batch_size: list[Positive] = []  # oldest
    max_queue_delay_microseconds: NonNegative = 0
    control_input: list[ControlInput] = []
    state: list[SequenceState] = []
    # The model may hand a request back to be run again (Triton's request rescheduling).
    iterative_sequence: bool = False


class Optimization(_Section, frozen=True):
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"


class Execution(_Section, frozen=True):
    """How one ``execute`` may behave before reposerve steps in."""

    # A limit on one execute; past it the instance is killed and replaced and the batch's
    # requests fail. TorchServe's responseTimeout default: generous for slow-but-working
    # models, finite so a hung one cannot hold its requests forever. 0 = no limit.
    timeout_seconds: Annotated[float, Meta(ge=0)] = 120.0
    # When a batch of several requests fails, run its requests again in halves to find the
    # one(s) at fault and fail only those. Off for models whose execute must not run twice.
    isolate_failures: bool = True


class Lifecycle(_Section, frozen=True):
    """How the server may treat the model under memory budgets."""

    pinned: bool = False  # never evicted to make room for another model


class OpenAI(_Section, frozen=True):
    """The model on the OpenAI-compatible routes (config/openai.py has the rules)."""

    kind: Literal["chat", "completion", "embedding"]
    # chat: a Jinja template file in the model folder; else tokenizer_config.json's
    chat_template: Annotated[str, Meta(pattern=r"^(?!\.\.?$)[^/\\]+$")] | None = None
    input: Annotated[str, Meta(min_length=1)] | None = None  # the text; default: see rules
    output: Annotated[str, Meta(min_length=1)] | None = None  # text deltas, or the vector
    max_tokens: Positive = 256  # for a request that sets none


class Warmup(_Section, frozen=True):
    batch_size: Positive = 1
    inputs: dict[str, Literal["zero", "random"]] = {}


class EnsembleStep(_Section, frozen=True):
    """One step of an ensemble (Triton's ``ensemble_scheduling.step``): a model of the
    repository, and which ensemble tensors its inputs read and its outputs write."""

    model: ModelName
    input_map: dict[str, str]  # the step model's input -> the ensemble tensor it reads
    output_map: dict[str, str]  # the step model's output -> the ensemble tensor it writes
    version: Annotated[int, Meta(ge=-1)] = -1  # -1: the newest ready version


class ModelConfig(_Section, frozen=True):
    name: ModelName | None = None
    backend: Backend | None = None
    # The model file in each version folder, when not the backend's own name (model.onnx,
    # model.pt / model.pt2, model.py): Triton's default_model_filename.
    default_model_filename: Annotated[str, Meta(pattern=r"^(?!\.\.?$)[^/\\]+$")] | None = None
    max_batch_size: NonNegative = 0
    # Triton's default-max-batch-size for auto-complete: with max_batch_size 0 and every
    # tensor of the model file dynamic in its first dimension, the model batches up to
    # this (with dynamic batching when > 1). A folder with no config file gets 4.
    default_max_batch_size: NonNegative = 0
    version_policy: VersionPolicy = VersionPolicy()
    input: list[TensorConfig] = []
    output: list[TensorConfig] = []
    # None = Triton's default: one instance on each visible GPU, else one on the CPU.
    instance_group: Annotated[list[InstanceGroup], Meta(min_length=1)] | None = None
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    optimization: Optimization = Optimization()
    execution: Execution = Execution()
    lifecycle: Lifecycle = Lifecycle()
    openai: OpenAI | None = None
    warmup: list[Warmup] = []
    # Triton's model_transaction_policy: execute yields any number of responses per
    # request (a generator); served only on the streaming endpoints. Set by itself when
    # a python model's execute is a generator.
    decoupled: bool = False
    step: list[EnsembleStep] = []  # backend = "ensemble": the pipeline, in any order
    parameters: dict[str, Any] = {}
