"""Triton's generate extension: one flat JSON object in, one per response out.

In a request, a key that names one of the model's inputs is that tensor (a scalar or a
flat array; BYTES as text), ``id`` is the request id, ``parameters`` is a nested object
read by the same rule, and every other key is a request parameter (a string, number or
bool). An input's shape is its config shape with the values filling it: fixed dimensions
first, what remains in the innermost -1, 1 in any other -1, and a batch of one in front
when the model batches. The request is then decoded as a V2 JSON request, with every
check that implies.

Keys are taken in document order, as Triton does: a key given twice (at the top, or once
there and once in ``parameters``) is refused, naming the first one repeated, rather than
one of its values being dropped unseen. A value of the wrong JSON kind is refused in
Triton's words (``attempt to access JSON non-string as string``).

A response is ``{"id"?, "model_name", "model_version", <output>: value...}``: one element
as a bare value, more as a flat array.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec

from reposerve.config import ModelConfig, TensorConfig
from reposerve.datatypes import element_count
from reposerve.errors import ProtocolError
from reposerve.protocol.request import InferRequest, decode_request, json_type_error
from reposerve.protocol.response import json_values, refuse_non_finite
from reposerve.tensor import Tensor

_encoder = msgspec.json.Encoder()
_PARAMETER_TYPES = (str, int, float, bool)


def decode_generate(body: bytes | bytearray, config: ModelConfig, model: str) -> InferRequest:
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
    _refuse_repeated_keys(body, specs, model)
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
            _sort(value, specs, values, parameters, model, nested=True)
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
    nested: bool = False,
) -> None:
    """Each key of ``table`` into the inputs' flat values or the request parameters;
    ``nested``: ``table`` is the ``parameters`` object."""
    for key, value in table.items():
        if key in specs:
            data = value if isinstance(value, list) else [value]
            if any(isinstance(element, list | dict) for element in data):
                raise ProtocolError(
                    f"model '{model}': input '{key}': a generate request gives a scalar or "
                    f"a flat array ({json_type_error(specs[key].datatype)})"
                )
            values[key] = data
        elif isinstance(value, _PARAMETER_TYPES):
            parameters[key] = value
        else:
            # Triton's words, with the keyword it was converting when nested.
            triton = f"parameter '{key}' has invalid type."
            if nested:
                triton = f"Converting keyword: 'parameters': {triton}"
            raise ProtocolError(
                f"model '{model}': '{key}' is not an input of the model, and as a parameter "
                f"it must be a string, number or bool ({triton})"
            )


# What the key scan stops at: in an object, a string, a bracket or a comma (the next
# string is a key); in an array, commas are skipped, so a long array of numbers is one step.
_IN_OBJECT = re.compile(rb'[\[\]{}",]')
_IN_ARRAY = re.compile(rb'[\[\]{}"]')
_QUOTE, _BACKSLASH, _OPEN_OBJECT, _COMMA = b'"'[0], b"\\"[0], b"{"[0], b","[0]


def _object_keys(body: bytes | bytearray) -> Iterator[tuple[str | None, str]]:
    """The keys of the JSON object ``body`` (valid JSON) in document order, repeats kept
    (a decoded dict keeps only the last): ``(None, key)`` for its own, ``(parent, key)``
    for those of an object that is the value of its key ``parent``."""
    containers: list[bool] = []  # each open container, innermost last: is it an object?
    expect_key = False  # the next string in the innermost object is a key
    parent: str | None = None  # the top-level key whose value is being read
    position = 0
    while True:
        scan = _IN_OBJECT if not containers or containers[-1] else _IN_ARRAY
        found = scan.search(body, position)
        if found is None:
            return
        start = found.start()
        char = body[start]
        position = start + 1
        if char == _QUOTE:
            position = _string_end(body, start)
            if expect_key and len(containers) <= 2:
                key = msgspec.json.decode(body[start:position])
                if len(containers) == 1:
                    parent = key
                    yield None, key
                else:
                    yield parent, key
            expect_key = False
        elif char == _COMMA:
            expect_key = True
        elif char in b"[{":
            containers.append(char == _OPEN_OBJECT)
            expect_key = char == _OPEN_OBJECT
        else:
            containers.pop()
            expect_key = False


def _string_end(body: bytes | bytearray, start: int) -> int:
    """Just past the closing quote of the JSON string opening at ``start``."""
    end = start
    while True:
        end = body.index(b'"', end + 1)
        escapes = end - 1
        while body[escapes] == _BACKSLASH:
            escapes -= 1
        if (end - 1 - escapes) % 2 == 0:  # an even run of backslashes escapes none
            return end + 1


def _refuse_repeated_keys(
    body: bytes | bytearray, specs: dict[str, TensorConfig], model: str
) -> None:
    """The first key given twice among the request's inputs, parameters and keywords, as
    Triton meets it: the top-level keys in order, each ``parameters`` object's in its place."""
    seen: set[str] = set()
    keywords: set[str] = set()
    for parent, key in _object_keys(body):
        if parent is not None and parent != "parameters":
            continue
        if parent is None and key in ("id", "parameters"):
            if key in keywords:
                raise ProtocolError(
                    f"model '{model}': keyword '{key}' is given more than once in the "
                    "generate request"
                )
            keywords.add(key)
            continue
        if key in seen:
            kind = "input" if key in specs else "parameter"
            raise ProtocolError(
                f"model '{model}': {kind} '{key}' is given more than once in the generate "
                f"request ({kind} '{key}' already exists in request)"
            )
        seen.add(key)


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
