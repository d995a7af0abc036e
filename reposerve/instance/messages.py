"""Control frames between the front and an instance process.

Each frame is a 4-byte little-endian length and a msgpack-encoded tagged Struct. Frames
carry only metadata: tensors stay in the slot named by the frame (``arena``). The one
exception to plain bytes is ``AddSlot``, which carries a file descriptor as SCM_RIGHTS
ancillary data alongside its first byte.
"""

from __future__ import annotations

import msgspec

from reposerve import framing
from reposerve.backends.base import (
    MetricFamilyGone,
    MetricState,
    ModelLog,
    RequestFailure,
    RequestSlice,
)
from reposerve.errors import ErrorKind


class TensorRef(msgspec.Struct, array_like=True, frozen=True):
    """Where one tensor lies in a slot, in wire layout (``reposerve.datatypes``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


# front -> instance
class Load(msgspec.Struct, tag=True, array_like=True):
    model: str
    version: int
    version_path: str
    backend: str
    config: bytes  # the ModelConfig, JSON-encoded
    instance_index: int
    device: str
    threads: int


class AddSlot(msgspec.Struct, tag=True, array_like=True):
    slot: int
    size: int


class DropSlot(msgspec.Struct, tag=True, array_like=True):
    """The front shrinks the slot pool of an idle process: forget this free slot."""

    slot: int


class Execute(msgspec.Struct, tag=True, array_like=True):
    batch_id: int
    slot: int
    slot_size: int
    inputs: list[TensorRef]
    # The client requests the batch holds, in order; empty: one request holding it all
    # (warmup). Only backends that answer per request read them (RequestAwareBackend).
    requests: list[RequestSlice] = []
    # How deep in model calls its requests are (0: clients'); its models' calls go one
    # deeper (Call.depth).
    call_depth: int = 0


class Resume(msgspec.Struct, tag=True, array_like=True):
    """A decoupled batch's last Response has been read: its slot space may be written
    again. Held back while a client is slow to take responses (backpressure)."""

    batch_id: int


class Cancel(msgspec.Struct, tag=True, array_like=True):
    """Every client of a decoupled batch has gone: stop producing its responses."""

    batch_id: int


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    pass


class ReadyQuery(msgspec.Struct, tag=True, array_like=True):
    """Ask the model whether it is ready (Triton's user-defined ``is_ready()``); sent only
    to an instance whose Ready said it has such a check, answered by a ReadyAnswer."""

    query_id: int


class CallResult(msgspec.Struct, tag=True, array_like=True):
    """A model call's answer: the outputs in its call slot, after the inputs, and the
    response's parameters (a JSON object's text). A decoupled callee's stream ends with
    one holding its last response, the one it marked final; or none (no outputs: Triton's
    empty final response) when the final flag came alone."""

    call_id: int
    slot_size: int
    outputs: list[TensorRef]
    parameters: str = "{}"


class CallResponse(msgspec.Struct, tag=True, array_like=True):
    """One response of a decoupled model call, in the call slot after the inputs; the
    front writes the next once the caller sends CallNext."""

    call_id: int
    slot_size: int
    outputs: list[TensorRef]
    parameters: str = "{}"


class CallFailure(msgspec.Struct, tag=True, array_like=True):
    call_id: int
    message: str
    kind: ErrorKind


# instance -> front
class Ready(msgspec.Struct, tag=True, array_like=True):
    max_inflight: int  # batches it runs at once
    staging: int  # further batches it accepts to start the moment one finishes
    config: bytes  # the ModelConfig completed from the model file, JSON-encoded
    per_request: bool = False  # its backend answers per request: send it the boundaries
    ready_check: bool = False  # the model says itself whether it is ready (ReadyQuery)


class ReadyAnswer(msgspec.Struct, tag=True, array_like=True):
    """The model's answer to a ReadyQuery: ready or not, or why its check failed."""

    query_id: int
    ready: bool
    error: str = ""  # the check raised, or returned what is not a bool


class LoadFailed(msgspec.Struct, tag=True, array_like=True):
    reason: str


class Answer(msgspec.Struct, array_like=True, frozen=True):
    """One request's own outputs in a batch's slot (a per-request backend's answer), and
    the parameters of its response (a JSON object's text)."""

    request: int
    outputs: list[TensorRef]
    parameters: str = "{}"


class Result(msgspec.Struct, tag=True, array_like=True):
    """A batch's end: its outputs, or (``answers``) each request's own; ``failed`` the
    requests that failed alone, the rest succeeded."""

    batch_id: int
    slot_size: int
    outputs: list[TensorRef]
    compute_ns: int
    failed: list[RequestFailure] = []
    answers: list[Answer] = []


class Response(msgspec.Struct, tag=True, array_like=True):
    """One of a decoupled batch's responses, in the slot after its inputs; the batch ends
    with a Result (no outputs) or a Failure. The next Response waits for a Resume."""

    batch_id: int
    slot_size: int
    outputs: list[TensorRef]
    request: int = -1  # the one request of the batch it answers (its rows); -1: all of them
    final: bool = False  # that request's last response
    failure: RequestFailure | None = None  # that request failed (and is ended)
    parameters: str = "{}"  # the response's parameters, a JSON object's text


class Call(msgspec.Struct, tag=True, array_like=True):
    """A model's call to a model (``context.infer``): its inputs lie in a call slot, a
    memfd of the instance's that the front opens through /proc as ``fd`` of this pid."""

    call_id: int
    fd: int
    slot_size: int
    model: str
    version: int  # -1: the newest ready one
    inputs: list[TensorRef]
    # Made by execute itself on a sync instance, which serves further batches nested
    # while it waits: room for one more until CallTaken. Not from the model's threads.
    nested: bool = True
    parameters: str = "{}"  # the request's parameters, a JSON object's text
    timeout_us: int = 0  # 0: none (the callee's default)
    # A call to a decoupled model, taking its responses one by one: each comes as a
    # CallResponse (the next only after CallNext), the stream ends with a CallResult.
    decoupled: bool = False
    depth: int = 1  # model calls from the client's request down to this one, itself included


class ModelControl(msgspec.Struct, tag=True, array_like=True):
    """A model's request to control the repository (Triton's ``pb_utils.load_model``,
    ``unload_model``, ``is_model_ready``), answered like a call: a CallResult whose
    parameters say ``{"ready": ...}``, or a CallFailure. ``body``: the request as the
    HTTP control endpoint takes it (a load's config and files, an unload's dependents)."""

    call_id: int
    action: str  # "load" | "unload" | "ready"
    model: str
    version: str = ""  # "ready": the version asked about ("" the model)
    body: bytes = b""


class CallNext(msgspec.Struct, tag=True, array_like=True):
    """The caller has taken a decoupled call's response out of the slot: write the next."""

    call_id: int


class CallCancel(msgspec.Struct, tag=True, array_like=True):
    """The caller cancels a call it takes as a stream: the callee's request is cancelled."""

    call_id: int


class CallSlotClosed(msgspec.Struct, tag=True, array_like=True):
    """The instance shrank its pool of call slots: the front lets go of this one (the
    memfd it opened as ``fd`` of the process)."""

    fd: int


class CallTaken(msgspec.Struct, tag=True, array_like=True):
    """The caller has its answer and runs on: the instance no longer waits on that call
    (a sync instance may still wait beneath batches it ran while waiting, until this)."""

    call_id: int


class Failure(msgspec.Struct, tag=True, array_like=True):
    batch_id: int
    message: str
    invalid_input: bool  # the model raised reposerve.InvalidInput: the client's fault
    fatal: bool = False  # the process ends after this answer (a poisoned CUDA context)
    verbatim: bool = False  # the message is whole as it is (Triton's words): no prefix


ToInstance = (
    Load
    | AddSlot
    | DropSlot
    | Execute
    | Resume
    | Cancel
    | CallResult
    | CallResponse
    | CallFailure
    | ReadyQuery
    | Shutdown
)
FromInstance = (
    Ready
    | ReadyAnswer
    | LoadFailed
    | Result
    | Response
    | Failure
    | Call
    | ModelControl
    | CallNext
    | CallCancel
    | CallTaken
    | CallSlotClosed
    | MetricState
    | MetricFamilyGone
    | ModelLog
)


def encode_frame(message: ToInstance | FromInstance) -> bytes:
    return framing.encode(message)
