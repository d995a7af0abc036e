"""ModelInfer's messages to and from what ``InferenceService.infer_parts`` takes.

A gRPC request becomes the V2 header an HTTP client would send plus each input's binary
data apart (``decode_parts``), so both fronts share one decoder with all its checks against
the model's config, and tensors are views of the request's bytes. Typed ``contents`` are
packed into that binary form here; ``raw_input_contents`` are passed as they came (one
per input that is not in client shared memory, in order, as Triton counts them). Triton
answers gRPC outputs in ``raw_output_contents`` always, one per output, an empty one for
an output written into shared memory (tritonclient finds an output's by its position);
so does this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from reposerve.answers import Answer
from reposerve.datatypes import pack_bytes
from reposerve.errors import ProtocolError
from reposerve.protocol.shared_memory import REGION

# Triton's InferTensorContents field for each datatype (FP16 and BF16 have none: raw only).
_CONTENTS = {
    "BOOL": ("bool_contents", np.bool_),
    "INT8": ("int_contents", np.int8),
    "INT16": ("int_contents", np.int16),
    "INT32": ("int_contents", np.int32),
    "INT64": ("int64_contents", np.int64),
    "UINT8": ("uint_contents", np.uint8),
    "UINT16": ("uint_contents", np.uint16),
    "UINT32": ("uint_contents", np.uint32),
    "UINT64": ("uint64_contents", np.uint64),
    "FP32": ("fp32_contents", np.float32),
    "FP64": ("fp64_contents", np.float64),
}
# Triton's: a decoupled model's stream ends with an empty response marked final when the
# request asks for it with this (a bool); every streamed response says whether it is final.
EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"
# Flags of the HTTP binary extension: meaningless over gRPC, ignored as Triton does; and
# EMPTY_FINAL, which is the front's to honour (tritonclient sends it on any call).
_FRONT_ONLY = ("binary_data", "binary_data_output", "binary_data_size", EMPTY_FINAL)


def parameter_value(parameter: Any) -> Any:
    """An ``InferParameter`` / ``ModelRepositoryParameter`` as its plain value."""
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def _parameters(entries: Any) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in entries.items() if key not in _FRONT_ONLY}


def request_parts(request: Any) -> tuple[dict[str, Any], list[bytes]]:
    """A ``ModelInferRequest`` as the V2 header (a dict, as decode_parts takes it) and each
    input's binary data: its ``raw_input_contents`` as they came, or its typed ``contents``
    packed into the same form."""
    raw = request.raw_input_contents
    # as tensor_region reads it: a region parameter with no value set names no region
    shared = [
        REGION in tensor.parameters and parameter_value(tensor.parameters[REGION]) is not None
        for tensor in request.inputs
    ]
    carried = shared.count(False)  # the inputs whose data the message carries
    if raw and len(raw) != carried:
        placed = " not in shared memory" if carried < len(shared) else ""
        raise ProtocolError(
            f"model '{request.model_name}': {len(raw)} raw_input_contents for "
            f"{carried} inputs{placed}; give raw contents for every such input or for none"
        )
    inputs = []
    parts: list[bytes] = []
    position = iter(raw)
    for tensor, in_region in zip(request.inputs, shared, strict=True):
        if in_region or (raw and tensor.HasField("contents")):
            if tensor.HasField("contents"):
                source = REGION if in_region else "raw_input_contents"
                raise ProtocolError(
                    f"model '{request.model_name}': input '{tensor.name}' has both contents "
                    f"and {source}; send one"
                )
            parts.append(b"")  # its bytes are read from the region
        else:
            parts.append(next(position) if raw else _packed(request.model_name, tensor))
        inputs.append(
            {
                "name": tensor.name,
                "datatype": tensor.datatype,
                "shape": list(tensor.shape),
                "parameters": _parameters(tensor.parameters),
            }
        )
    header: dict[str, Any] = {"inputs": inputs, "parameters": _parameters(request.parameters)}
    if request.id:
        header["id"] = request.id
    if request.outputs:
        header["outputs"] = [
            {"name": output.name, "parameters": _parameters(output.parameters)}
            for output in request.outputs
        ]
    return header, parts


def _packed(model: str, tensor: Any) -> bytes:
    """Typed ``contents`` in the binary wire form (numbers little-endian, BYTES framed)."""
    contents = tensor.contents
    if tensor.datatype == "BYTES":
        return pack_bytes(contents.bytes_contents)
    kind = _CONTENTS.get(tensor.datatype)
    if kind is None:
        raise ProtocolError(
            f"model '{model}': input '{tensor.name}': {tensor.datatype!r} has no typed "
            "contents field; send it in raw_input_contents"
        )
    field, dtype = kind
    return np.asarray(getattr(contents, field), dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def wants_empty_final(request: Any) -> bool:
    """Whether ``request`` asks for an empty final response (EMPTY_FINAL, a bool)."""
    if EMPTY_FINAL not in request.parameters:
        return False
    value = request.parameters[EMPTY_FINAL]
    if value.WhichOneof("parameter_choice") != "bool_param":
        raise ProtocolError(
            f"model '{request.model_name}': parameter {EMPTY_FINAL} must be a bool_param"
        )
    return value.bool_param


def stream_encoder(stream_class: Any, request: Any) -> Callable[[Answer], Any]:
    """``encode(answer)`` of an answer from ``stream_parts``: a
    ``ModelStreamInferResponse`` whose ``ModelInferResponse`` is filled in place (the
    outputs' bytes copied, so the answer may be released after), marked FINAL or not."""

    def encode(answer: Answer) -> Any:
        response = stream_class()
        infer_response = response.infer_response
        _fill(infer_response, request, answer)
        infer_response.parameters[FINAL].bool_param = answer.final
        return response

    return encode


def stream_ending(stream_class: Any, request: Any, error: str = "") -> Any:
    """The empty final response, or (``error``) a request's error: both name the request
    (id, model, version) and are marked final, as Triton's are."""
    response = stream_class(error_message=error)
    infer_response = response.infer_response
    infer_response.model_name = request.model_name
    infer_response.model_version = request.model_version
    infer_response.id = request.id
    infer_response.parameters[FINAL].bool_param = True
    return response


def response_encoder(response_class: Any, request: Any) -> Callable[[Answer], Any]:
    """``encode(answer)`` of an answer from ``infer_parts``: the ``ModelInferResponse``,
    every output in ``raw_output_contents``, its bytes copied into the message (so the
    answer may be released after)."""

    def encode(answer: Answer) -> Any:
        response = response_class()
        _fill(response, request, answer)
        return response

    return encode


def _fill(response: Any, request: Any, answer: Answer) -> None:
    """A ``ModelInferResponse`` naming ``request``, with the parameters the model set and
    every output in raw_output_contents (copied: the tensors are views valid only while
    encoding); an output in client shared memory has an empty entry and no parameters, as
    Triton answers it (grpc/infer_handler.cc)."""
    response.model_name = request.model_name
    response.model_version = answer.version
    response.id = request.id
    _set_parameters(response.parameters, answer.parameters)
    for name, tensor, _ in answer.outputs:
        response.outputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(bytes(tensor.memory()))


def _set_parameters(entries: Any, parameters: dict[str, Any]) -> None:
    """``parameters`` into an ``InferParameter`` map, each in the field its type takes."""
    for key, value in parameters.items():
        entry = entries[key]
        if isinstance(value, bool):
            entry.bool_param = value
        elif isinstance(value, int):
            entry.int64_param = value
        elif isinstance(value, float):
            entry.double_param = value
        else:
            entry.string_param = str(value)
