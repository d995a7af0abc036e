"""The front's end of a model's calls to models (``context.infer`` in an instance).

The call's inputs are read in place from the calling process's call slot, checked against
the callee's config as any request's are, and run through the callee's scheduler (so they
are batched with its other requests); the outputs are written back into the same slot,
after the inputs, straight from the callee's slot. A decoupled callee's responses go the
same way one at a time, each written once the caller has taken the one before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from reposerve.config import ModelConfig
from reposerve.errors import (
    ErrorKind,
    InstanceError,
    ProtocolError,
    ReposerveError,
    SchedulerError,
)
from reposerve.instance.arena import Slot, align
from reposerve.instance.messages import Call, CallFailure, CallResponse, CallResult, TensorRef
from reposerve.pipelines.ensemble import StepScheduler
from reposerve.protocol.request import InferRequest, decode_parts
from reposerve.scheduler.lease import LeaseStream
from reposerve.tensor import Tensor

# Model calls nested in one client's request, at most: a model that calls itself without
# end fails here at once, its whole chain answered, rather than at the execution timeout
# (a sync instance runs up to 64 batches nested while its models wait on calls).
MAX_CALL_DEPTH = 32

_parameters_decoder = msgspec.json.Decoder(dict[str, Any])
_parameters_encoder = msgspec.json.Encoder()


class StreamScheduler(Protocol):
    def stream(self, request: InferRequest, call_depth: int = 0) -> LeaseStream: ...


class CalledModel(Protocol):
    """What a call needs of the model it calls (a ModelVersion); read only."""

    @property
    def config(self) -> ModelConfig: ...

    @property
    def output_names(self) -> tuple[str, ...]: ...

    @property
    def scheduler(self) -> StepScheduler: ...

    @property
    def instance_scheduler(self) -> StreamScheduler:
        """A decoupled model's (never an ensemble's): its responses one by one."""
        ...


Resolve = Callable[[str, str | None], CalledModel]
"""The READY version of a model (``Repository.get``); raises RepositoryError otherwise."""


class CallLink(Protocol):
    """The way back to a caller that takes a decoupled call's responses one by one."""

    async def send(self, response: CallResponse) -> None:
        """Send one response; return once the caller has taken it (CallNext)."""
        ...

    def attach(self, stream: LeaseStream) -> None:
        """The call's responses come through ``stream``: a CallCancel cancels it."""
        ...


async def serve_call(
    call: Call, slot: Slot, resolve: Resolve, caller: str, link: CallLink
) -> CallResult | CallFailure:
    """``caller`` (the calling model's label) names it in errors. A call to a decoupled
    model (``call.decoupled``) sends each response through ``link`` but the last, which
    the CallResult carries (a CANCELLED CallFailure when the caller cancelled it)."""
    try:
        if call.depth > MAX_CALL_DEPTH:
            raise ProtocolError(
                f"model calls nest {call.depth} deep, beyond the limit of {MAX_CALL_DEPTH}. "
                "Hint: a model that calls itself needs a case that ends the recursion"
            )
        model = resolve(call.model, None if call.version < 0 else str(call.version))
        if model.config.decoupled and not call.decoupled:
            raise ProtocolError(
                f"model '{call.model}' is decoupled (it streams): a model call takes one "
                "answer. Hint: call it with exec(decoupled=True)",
                kind=ErrorKind.UNSUPPORTED,
            )
        view = memoryview(slot.buffer)
        asked = _parameters_decoder.decode(call.parameters)
        if call.timeout_us:
            asked["timeout"] = call.timeout_us
        header = {
            "inputs": [
                {"name": ref.name, "datatype": ref.datatype, "shape": list(ref.shape)}
                for ref in call.inputs
            ],
            "parameters": asked,
        }
        raws = [view[ref.offset : ref.offset + ref.nbytes] for ref in call.inputs]
        request = decode_parts(header, raws, model.config, call.model)
        start = align(max((ref.offset + ref.nbytes for ref in call.inputs), default=0))
        if model.config.decoupled:
            refs, answered = await _stream(model, request, call, slot, start, link)
            return CallResult(call.call_id, slot.size, refs, answered)
        with await model.scheduler.lease(request, call_depth=call.depth) as lease:
            # a stateful model's kept state is its own, as it is kept from its clients
            outputs = {n: t for n, t in lease.outputs.items() if n in model.output_names}
            refs = _write(slot, start, outputs)
            return CallResult(call.call_id, slot.size, refs, _parameters_text(lease.parameters))
    except ReposerveError as exc:
        message = f"{caller}: calling model '{call.model}': {exc.message}"
        return CallFailure(call.call_id, message, exc.kind)


async def _stream(
    model: CalledModel, request: InferRequest, call: Call, slot: Slot, start: int, link: CallLink
) -> tuple[list[TensorRef], str]:
    """A decoupled model's responses to a call, one at a time through the call slot: each
    is written there once the caller took the one before, and its lease released at once
    (the callee goes on meanwhile). The one the model marked final is the end's (the
    CallResult's outputs and parameters); none (no outputs) when the model ended with a
    flag alone (Triton's empty final response)."""
    stream = model.instance_scheduler.stream(request, call_depth=call.depth)
    link.attach(stream)
    last: tuple[list[TensorRef], str] = ([], "{}")
    try:
        async for lease in stream:
            with lease:
                refs = _write(slot, start, lease.outputs)
            parameters = _parameters_text(lease.parameters)
            if lease.final:  # the stream ends here: it goes with the end
                last = (refs, parameters)
                continue
            await link.send(CallResponse(call.call_id, slot.size, refs, parameters))
        if stream.cancelled:
            raise SchedulerError("the request was cancelled", ErrorKind.CANCELLED)
    finally:
        stream.cancel()
    return last


def _write(slot: Slot, start: int, outputs: dict[str, Tensor]) -> list[TensorRef]:
    """The outputs in the call slot from ``start``, one after another."""
    refs = []
    offset = start
    for name, tensor in outputs.items():
        refs.append(TensorRef(name, tensor.datatype, tensor.shape, offset, len(tensor.raw)))
        offset = align(offset + len(tensor.raw))
    try:
        slot.ensure(offset)
        for ref, tensor in zip(refs, outputs.values(), strict=True):
            slot.buffer[ref.offset : ref.offset + ref.nbytes] = tensor.memory()
    except (OSError, ValueError) as exc:  # the caller's process went away meanwhile
        raise InstanceError(f"the calling instance is gone ({exc})") from exc
    return refs


def _parameters_text(parameters: dict[str, Any]) -> str:
    return _parameters_encoder.encode(parameters).decode() if parameters else "{}"
