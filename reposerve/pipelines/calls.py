"""The front's end of a model's calls to models (``context.infer`` in an instance).

The call's inputs are read in place from the calling process's call slot, checked against
the callee's config as any request's are, and run through the callee's scheduler (so they
are batched with its other requests); the outputs are written back into the same slot,
after the inputs.
"""

from __future__ import annotations

from typing import Any

import msgspec

from reposerve.errors import ErrorKind, InstanceError, ProtocolError, ReposerveError
from reposerve.instance.arena import Slot, align
from reposerve.instance.messages import Call, CallFailure, CallResult, TensorRef
from reposerve.pipelines.ensemble import Resolve
from reposerve.protocol.request import decode_parts
from reposerve.tensor import Tensor

_parameters_decoder = msgspec.json.Decoder(dict[str, Any])
_parameters_encoder = msgspec.json.Encoder()


async def serve_call(
    call: Call, slot: Slot, resolve: Resolve, caller: str
) -> CallResult | CallFailure:
    """``caller`` (the calling model's label) names it in errors."""
    try:
        model = resolve(call.model, None if call.version < 0 else str(call.version))
        if model.config.decoupled:
            raise ProtocolError(
                f"model '{call.model}' is decoupled (it streams): a model call takes one answer",
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

        def write(
            outputs: dict[str, Tensor], parameters: dict[str, Any]
        ) -> tuple[list[TensorRef], dict[str, Any]]:
            refs = []
            offset = start
            for name, tensor in outputs.items():
                refs.append(TensorRef(name, tensor.datatype, tensor.shape, offset, len(tensor.raw)))
                offset = align(offset + len(tensor.raw))
            try:
                slot.ensure(offset)
                for ref, tensor in zip(refs, outputs.values(), strict=True):
                    slot.buffer[ref.offset : ref.offset + ref.nbytes] = tensor.raw
            except (OSError, ValueError) as exc:  # the caller's process went away meanwhile
                raise InstanceError(f"the calling instance is gone ({exc})") from exc
            return refs, parameters

        refs, answered = await model.scheduler.submit(request, write)
        text = _parameters_encoder.encode(answered).decode() if answered else "{}"
        return CallResult(call.call_id, slot.size, refs, text)
    except ReposerveError as exc:
        message = f"{caller}: calling model '{call.model}': {exc.message}"
        return CallFailure(call.call_id, message, exc.kind)
