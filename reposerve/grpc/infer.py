"""ModelInfer's messages to and from the V2 binary body ``InferenceService.infer`` takes.

A gRPC request becomes the same JSON header + binary tensor data an HTTP client sends
(every input binary, every output asked for binary), so both fronts share one decoder with
all its checks against the model's config, and one encoder. Typed ``contents`` are packed
into that binary form here; ``raw_input_contents`` are passed as they came. Triton answers
gRPC outputs in ``raw_output_contents`` always; so does this.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from reposerve.datatypes import pack_bytes
from reposerve.errors import ProtocolError

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
# Flags of the HTTP binary extension: meaningless over gRPC, ignored as Triton does.
_BINARY_FLAGS = ("binary_data", "binary_data_output", "binary_data_size")


class _OutputHeader(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] = {}


class _ResponseHeader(msgspec.Struct):
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[_OutputHeader] = []


_response_decoder = msgspec.json.Decoder(_ResponseHeader)
_encoder = msgspec.json.Encoder()


def parameter_value(parameter: Any) -> Any:
    """An ``InferParameter`` / ``ModelRepositoryParameter`` as its plain value."""
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def _parameters(entries: Any) -> dict[str, Any]:
    return {
        key: parameter_value(value) for key, value in entries.items() if key not in _BINARY_FLAGS
    }


def request_body(request: Any) -> tuple[bytes, int]:
    """The V2 binary body and its JSON header's length for a ``ModelInferRequest``."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(
            f"model '{request.model_name}': {len(raw)} raw_input_contents for "
            f"{len(request.inputs)} inputs; give raw contents for every input or for none"
        )
    inputs = []
    parts: list[bytes] = []
    for index, tensor in enumerate(request.inputs):
        data = raw[index] if raw else _packed(request.model_name, tensor)
        if raw and tensor.HasField("contents"):
            raise ProtocolError(
                f"model '{request.model_name}': input '{tensor.name}' has both contents and "
                "raw_input_contents; send one"
            )
        parameters = _parameters(tensor.parameters)
        parameters["binary_data_size"] = len(data)
        inputs.append(
            {
                "name": tensor.name,
                "datatype": tensor.datatype,
                "shape": list(tensor.shape),
                "parameters": parameters,
            }
        )
        parts.append(data)
    header: dict[str, Any] = {"inputs": inputs}
    if request.id:
        header["id"] = request.id
    parameters = _parameters(request.parameters)
    parameters["binary_data_output"] = True
    header["parameters"] = parameters
    if request.outputs:
        header["outputs"] = [
            {
                "name": output.name,
                "parameters": {**_parameters(output.parameters), "binary_data": True},
            }
            for output in request.outputs
        ]
    encoded = _encoder.encode(header)
    return b"".join([encoded, *parts]), len(encoded)


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


def fill_response(response: Any, body: bytes, header_length: int | None) -> None:
    """Copy the V2 binary response ``body`` into a ``ModelInferResponse``."""
    if header_length is None:  # no outputs at all: the body is the JSON header alone
        header_length = len(body)
    header = _response_decoder.decode(body[:header_length])
    response.model_name = header.model_name
    response.model_version = header.model_version
    response.id = header.id
    view = memoryview(body)
    cursor = header_length
    for output in header.outputs:
        size = output.parameters.get("binary_data_size", 0)
        response.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        response.raw_output_contents.append(bytes(view[cursor : cursor + size]))
        cursor += size
