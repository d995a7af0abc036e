"""Triton's generate extension: one flat JSON object in, one per response out.

In a request, a key that names one of the model's inputs is that tensor (a scalar or a
flat array; BYTES as text), ``id`` is the request id, ``parameters`` is a nested object
read by the same rule, and every other key is a request parameter (a string, number or
bool). An input's shape is its config shape with the values filling it: fixed dimensions
first, what remains in the innermost -1, 1 in any other -1, and a batch of one in front
when the model batches. The request is then decoded as a V2 JSON request, with every
check that implies.

A response is ``{"id"?, "model_name", "model_version", <output>: value...}``: one element
as a bare value, more as a flat array.
"""

from __future__ import annotations

from typing import Any

import msgspec

from reposerve.config import ModelConfig, TensorConfig
from reposerve.datatypes import element_count
from reposerve.errors import ProtocolError
from reposerve.protocol.request import InferRequest, decode_request
from reposerve.protocol.response import json_values, refuse_non_finite
from reposerve.tensor import Tensor

_encoder = msgspec.json.Encoder()
_PARAMETER_TYPES = (str, int, float, bool)


def decode_generate(body: bytes, config: ModelConfig, model: str) -> InferRequest:
    try:
        document = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"model '{model}': malformed generate request JSON: {exc}") from exc
    except RecursionError:
        raise ProtocolError(f"model '{model}': generate request JSON nests too deeply") from None
    if not isinstance(document, dict):
        raise ProtocolError(
            f"model '{model}': a generate request is a JSON object of inputs and parameters, "
            f"got {type(document).__name__}"
        )
    specs = {spec.name: spec for spec in config.input}
    if "parameters" in specs:
        raise ProtocolError(
            f"model '{model}': its input 'parameters' clashes with the generate extension's "
            "nested parameters object; call /infer instead"
        )
    values: dict[str, Any] = {}
    parameters: dict[str, Any] = {}
    header: dict[str, Any] = {}
    for key, value in document.items():
        if key == "parameters":
            if not isinstance(value, dict):
                raise ProtocolError(
                    f"model '{model}': parameters must be a JSON object (Expected JSON object "
                    "for keyword: 'parameters')"
                )
            _sort(value, specs, values, parameters, model)
        elif key == "id":
            if not isinstance(value, str):
                raise ProtocolError(f"model '{model}': id must be a string")
            header["id"] = value
        else:
            _sort({key: value}, specs, values, parameters, model)
    batch = [1] if config.max_batch_size > 0 else []
    header["inputs"] = [
        {
            "name": name,
            "datatype": specs[name].datatype,
            "shape": batch + _shape(specs[name], len(data), model),
            "data": data,
        }
        for name, data in values.items()
    ]
    header["parameters"] = parameters
    return decode_request(_encoder.encode(header), None, config, model)


def _sort(
    table: dict[str, Any],
    specs: dict[str, TensorConfig],
    values: dict[str, Any],
    parameters: dict[str, Any],
    model: str,
) -> None:
    """Each key of ``table`` into the inputs' flat values or the request parameters."""
    for key, value in table.items():
        if key in specs:
            data = value if isinstance(value, list) else [value]
            if any(isinstance(element, list | dict) for element in data):
                raise ProtocolError(
                    f"model '{model}': input '{key}': a generate request gives a scalar or "
                    "a flat array"
                )
            values[key] = data
        elif isinstance(value, _PARAMETER_TYPES):
            parameters[key] = value
        else:
            raise ProtocolError(
                f"model '{model}': '{key}' is not an input of the model, and as a parameter "
                f"it must be a string, number or bool (parameter '{key}' has invalid type)"
            )


def _shape(spec: TensorConfig, count: int, model: str) -> list[int]:
    fixed = element_count(dim for dim in spec.shape if dim != -1)
    free = [index for index, dim in enumerate(spec.shape) if dim == -1]
    shape = [1 if dim == -1 else dim for dim in spec.shape]
    if free and fixed and count % fixed == 0:
        shape[free[-1]] = count // fixed
    if element_count(shape) != count:
        raise ProtocolError(
            f"model '{model}': input '{spec.name}': {count} values do not fill its shape "
            f"{spec.shape}"
        )
    return shape


def encode_generate(
    model: str, version: str, request_id: str | None, outputs: list[tuple[str, Tensor]]
) -> bytes:
    document: dict[str, Any] = {}
    if request_id:
        document["id"] = request_id
    document["model_name"] = model
    document["model_version"] = version
    for name, tensor in outputs:
        flat = json_values(model, name, tensor)
        document[name] = flat[0] if len(flat) == 1 else flat
    encoded = _encoder.encode(document)
    if b"null" in encoded:  # a non-finite float, or text holding "null": look closely
        refuse_non_finite(model, [(name, tensor, False) for name, tensor in outputs])
    return encoded
