"""Decode a V2 infer request (JSON, or JSON header + binary tensor data) into Tensors.

Everything a client sends is checked against the model's config before anything is
allocated from it: a shape is only trusted after the bytes that back it have been found
in the body, so a lying shape or length costs nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

from reposerve.config import ModelConfig, TensorConfig
from reposerve.datatypes import NUMPY_DTYPES, byte_runs, chunks, element_count, pack_bytes
from reposerve.errors import ProtocolError
from reposerve.protocol.classification import UNRANKED
from reposerve.protocol.shared_memory import (
    REGION,
    UNAVAILABLE,
    SharedTensors,
    TensorRegion,
    tensor_region,
)
from reposerve.tensor import FileUnreadable, Tensor


class _InputHeader(msgspec.Struct):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: Any = msgspec.UNSET


class _OutputHeader(msgspec.Struct):
    name: str
    parameters: dict[str, Any] | None = None


class _RequestHeader(msgspec.Struct):
    inputs: list[_InputHeader]
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[_OutputHeader] | None = None


_header_decoder = msgspec.json.Decoder(_RequestHeader)

# Request parameters the server acts on; the rest are the model's (request.parameters()).
_SERVER_PARAMETERS = frozenset(
    {
        "binary_data_output", "priority", "timeout", "triton_enable_empty_final_response",
        "sequence_id", "sequence_start", "sequence_end",
    }
)  # fmt: skip
_MAX_CORRELATION_ID = 2**64 - 1  # Triton's is a uint64 (or a string)
# A string correlation id's bound, in UTF-8 bytes. Triton documents none (it copies the
# string into every request's CORRID tensor); ids are names (a UUID is 36), so this leaves
# room and keeps what errors and logs echo of an id short.
MAX_STRING_CORRELATION_ID = 256
_ECHOED = 64  # characters of a refused id an error shows


class InferRequest(msgspec.Struct):
    """A decoded request: validated inputs and how each requested output is to be sent."""

    id: str | None
    inputs: dict[str, Tensor]
    batch_size: int
    outputs: dict[str, bool | None] | None  # name -> binary (None: as binary_output); None = all
    binary_output: bool  # default for outputs that do not say
    priority: int
    timeout_us: int
    # output -> K for outputs asked for as their top-K classes (classification extension)
    classifications: dict[str, int] = {}
    # The request's parameters the server does not act on itself: the model's to read
    # (Triton's request.parameters()).
    parameters: dict[str, Any] = {}
    # output -> where in a client's shared-memory region it is to be written
    output_regions: dict[str, TensorRegion] = {}
    # Sequence batching: the sequence's correlation id (0 or "": none) and whether this
    # request starts or ends it.
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False


Body = bytes | bytearray | memoryview
"""A request's bytes as a front holds them: as received, inflated, or in a front worker's
slot."""
Raw = bytes | memoryview
"""A tensor's bytes sent apart from its request's header (``decode_parts``)."""


def decode_request(
    body: Body,
    header_length: int | None,
    config: ModelConfig,
    model: str,
    shared: SharedTensors = UNAVAILABLE,
) -> InferRequest:
    """Parse ``body`` for ``config``'s model; ``model`` names it in errors. Tensors placed
    in client shared memory are read, and output regions reserved, through ``shared``."""
    size = len(body)
    if header_length is None:
        header_length = size
    elif header_length > size:
        raise ProtocolError(
            f"model '{model}': Inference-Header-Content-Length {header_length} exceeds "
            f"the {size}-byte body"
        )
    view = memoryview(body)
    try:
        header = _header_decoder.decode(view[:header_length])
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"model '{model}': malformed request JSON: {exc}") from exc
    except RecursionError:
        # msgspec recurses per nesting level and stops at Python's recursion limit.
        raise ProtocolError(
            f"model '{model}': request JSON nests arrays or objects too deeply to parse; "
            "send tensor data flat, or nested no deeper than its shape"
        ) from None

    cursor = header_length

    def read(item: _InputHeader, where: str) -> Tensor:
        nonlocal cursor
        tensor, cursor = _read_tensor(item, view, cursor, where, shared)
        return tensor

    inputs = _read_inputs(header, read, config, model)
    if cursor != size:
        raise ProtocolError(
            f"model '{model}': body has {size - cursor} bytes beyond the header and the "
            "binary_data_size of its inputs"
        )
    return _request(header, inputs, config, model, shared)


def decode_parts(
    header: dict[str, Any],
    raws: Sequence[Raw],
    config: ModelConfig,
    model: str,
    shared: SharedTensors = UNAVAILABLE,
) -> InferRequest:
    """A request whose tensor data travels apart from its header (gRPC): ``header`` is the
    V2 JSON header as a dict (inputs without ``data``), ``raws[i]`` the binary data of input
    ``i`` (empty for an input placed in shared memory). The tensors are views of ``raws``
    or of the regions; every check is decode_request's."""
    try:
        parsed = msgspec.convert(header, _RequestHeader)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"model '{model}': malformed request: {exc}") from exc
    if len(raws) != len(parsed.inputs):
        raise ProtocolError(
            f"model '{model}': {len(raws)} raw contents for {len(parsed.inputs)} inputs; "
            "give one per input"
        )
    position = iter(raws)

    def read(item: _InputHeader, where: str) -> Tensor:
        raw = memoryview(next(position))
        place = tensor_region(item.parameters or {}, where)
        if place is not None:
            if len(raw):
                raise ProtocolError(f"{where}: has both raw contents and {REGION}; send one")
            return _shared_input(item, place, shared, where)
        shape = tuple(item.shape)
        _check_binary(item.datatype, raw, element_count(shape), shape, where)
        return Tensor(item.datatype, shape, raw)

    inputs = _read_inputs(parsed, read, config, model)
    return _request(parsed, inputs, config, model, shared)


def _read_inputs(
    header: _RequestHeader,
    read: Callable[[_InputHeader, str], Tensor],
    config: ModelConfig,
    model: str,
) -> dict[str, Tensor]:
    """Each input checked against the config, then its data read with ``read``."""
    specs = {tensor.name: tensor for tensor in config.input}
    inputs: dict[str, Tensor] = {}
    for item in header.inputs:
        where = f"model '{model}': input '{item.name}'"
        spec = specs.get(item.name)
        if spec is None:
            known = ", ".join(specs) or "none"
            raise ProtocolError(f"model '{model}': unknown input '{item.name}' (inputs: {known})")
        if item.name in inputs:
            raise ProtocolError(
                f"{where}: given more than once (input '{item.name}' already exists in request)"
            )
        _check_signature(item, spec, config.max_batch_size, where)
        inputs[item.name] = read(item, where)
    return inputs


def _request(
    header: _RequestHeader,
    inputs: dict[str, Tensor],
    config: ModelConfig,
    model: str,
    shared: SharedTensors,
) -> InferRequest:
    specs = {tensor.name: tensor for tensor in config.input}
    missing = [name for name, spec in specs.items() if name not in inputs and not spec.optional]
    if missing:
        required = sum(not spec.optional for spec in specs.values())
        expected = (  # and Triton's words, which its clients' tests look for
            f"expected {required} inputs"
            if required == len(specs)
            else f"expected number of inputs between {required} and {len(specs)}"
        )
        raise ProtocolError(
            f"model '{model}': missing required input(s): {', '.join(missing)} ({expected} "
            f"but got {len(inputs)} inputs)"
        )
    return InferRequest(
        id=header.id,
        inputs=inputs,
        batch_size=_batch_size(inputs, config.max_batch_size, model),
        **_requested_outputs(header.outputs, config, model, shared),
        **_request_parameters(header.parameters, config, model),
    )


def _check_signature(item: _InputHeader, spec: TensorConfig, max_batch: int, where: str) -> None:
    if item.datatype != spec.datatype:
        raise ProtocolError(f"{where}: expected datatype {spec.datatype}, got {item.datatype}")
    if any(dim < 0 for dim in item.shape):
        raise ProtocolError(f"{where}: shape {item.shape} has a negative dimension")
    dims = item.shape
    if max_batch > 0:
        if not dims or not 1 <= dims[0] <= max_batch:
            raise ProtocolError(
                f"{where}: shape {item.shape} needs a batch dimension of 1..{max_batch} first"
            )
        dims = dims[1:]
    if len(dims) != len(spec.shape) or any(
        want not in (-1, got) for want, got in zip(spec.shape, dims, strict=True)
    ):
        expected = ([-1] if max_batch > 0 else []) + spec.shape
        raise ProtocolError(f"{where}: expected shape {expected}, got {item.shape}")


def _read_tensor(
    item: _InputHeader, view: memoryview, cursor: int, where: str, shared: SharedTensors
) -> tuple[Tensor, int]:
    shape = tuple(item.shape)
    count = element_count(shape)
    parameters = item.parameters or {}
    binary_size = parameters.get("binary_data_size")
    place = tensor_region(parameters, where)
    if place is not None:
        if binary_size is not None or item.data is not msgspec.UNSET:
            raise ProtocolError(
                f"{where}: set only one of data, binary_data_size and {REGION} "
                "(the tensor's data is in shared memory)"
            )
        return _shared_input(item, place, shared, where), cursor
    if binary_size is not None:
        if item.data is not msgspec.UNSET:
            raise ProtocolError(f"{where}: has both data and binary_data_size")
        if type(binary_size) is not int or binary_size < 0:
            raise ProtocolError(f"{where}: binary_data_size must be an int >= 0")
        left = len(view) - cursor
        if binary_size > left:
            raise ProtocolError(
                f"{where}: binary_data_size {binary_size} exceeds the {left} bytes left in the body"
            )
        raw = view[cursor : cursor + binary_size]
        _check_binary(item.datatype, raw, count, shape, where)
        return Tensor(item.datatype, shape, raw), cursor + binary_size
    if item.data is msgspec.UNSET:
        raise ProtocolError(f"{where}: has neither data nor binary_data_size")
    return Tensor(item.datatype, shape, _json_to_wire(item, count, where)), cursor


def _shared_input(
    item: _InputHeader, place: TensorRegion, shared: SharedTensors, where: str
) -> Tensor:
    """An input whose bytes lie in a client's region, of exactly the size its shape and
    datatype take: read from there into the batch (no copy here), or for BYTES read now,
    to check that many well-framed elements are there."""
    shape = tuple(item.shape)
    count = element_count(shape)
    window = shared.read(place, where)
    if item.datatype == "BYTES":
        try:
            raw = window.read()
            byte_runs(raw, count)
        except FileUnreadable as exc:
            raise ProtocolError(str(exc)) from None
        except ValueError as exc:
            raise ProtocolError(
                f"{where}: the {place.byte_size} bytes in region '{place.region}' are not "
                f"serialized BYTES of shape {list(shape)}: the data {exc}"
            ) from None
        return Tensor(item.datatype, shape, raw)
    needed = count * NUMPY_DTYPES[item.datatype].itemsize
    if place.byte_size != needed:
        raise ProtocolError(
            f"{where}: shared_memory_byte_size {place.byte_size} in region "
            f"'{place.region}' does not match shape {list(shape)} of {item.datatype}, "
            f"which takes {needed} bytes"
        )
    return Tensor(item.datatype, shape, window)


def _check_binary(datatype: str, raw: memoryview, count: int, shape: tuple, where: str) -> None:
    if datatype == "BYTES":
        try:
            byte_runs(raw, count)
        except ValueError as exc:
            raise ProtocolError(f"{where}: BYTES data for shape {list(shape)} {exc}") from exc
        return
    needed = count * NUMPY_DTYPES[datatype].itemsize
    if len(raw) != needed:
        raise ProtocolError(
            f"{where}: binary data holds {len(raw)} bytes, shape {list(shape)} of "
            f"{datatype} needs {needed}"
        )


def _holds_lists(values: Sequence[Any]) -> bool:
    return any(map(isinstance, values, itertools.repeat(list)))


def _holds_values(values: Sequence[Any]) -> bool:
    return not all(map(isinstance, values, itertools.repeat(list)))


def _flatten(data: Any, where: str) -> list:
    """The values of nested JSON arrays, in order. Levels that hold lists only are
    flattened by C iterators (no Python step per element); a level mixing lists and
    values is walked."""
    if not isinstance(data, list):
        raise ProtocolError(f"{where}: data must be a JSON array")
    while data and not any(map(_holds_values, chunks(data))):
        level: list = []
        for part in chunks(data):
            level.extend(itertools.chain.from_iterable(part))
        data = level
    if not any(map(_holds_lists, chunks(data))):
        return data
    flat: list = []
    stack = [iter(data)]
    while stack:
        for element in stack[-1]:
            if isinstance(element, list):
                stack.append(iter(element))
                break
            flat.append(element)
        else:
            stack.pop()
    return flat


# What kinds of JSON values each datatype family accepts (numpy dtype.kind of np.array(data)).
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
# Triton's words for a JSON value of the wrong kind, by the kind the datatype wants (its
# clients' tests look for them).
_TRITON_TYPE_ERRORS = {
    "b": "attempt to access JSON non-boolean as boolean",
    "i": "attempt to access JSON non-signed-integer as signed-integer",
    "u": "attempt to access JSON non-unsigned-integer as unsigned-integer",
    "f": "attempt to access JSON non-number as double",
    "O": "attempt to access JSON non-string as string",
}


def json_type_error(datatype: str) -> str:
    """Triton's words for a JSON value that is not of ``datatype``'s kind."""
    return _TRITON_TYPE_ERRORS[NUMPY_DTYPES[datatype].kind]


def _json_to_wire(item: _InputHeader, count: int, where: str) -> bytes:
    if item.datatype == "BYTES":
        flat = _flatten(item.data, where)
        _check_count(len(flat), count, item, where)
        encoded: list[bytes] = []
        try:
            for part in chunks(flat):  # C loops, a chunk at a time (see C_LOOP_CHUNK)
                encoded.extend(map(str.encode, part))
        except TypeError:  # a value that is not a string
            raise ProtocolError(
                f"{where}: BYTES data in JSON must be strings ({json_type_error('BYTES')})"
            ) from None
        return pack_bytes(encoded)
    if item.datatype == "BF16":
        raise ProtocolError(f"{where}: BF16 data must be sent as binary tensor data")
    if not isinstance(item.data, list):
        raise ProtocolError(f"{where}: data must be a JSON array")
    try:
        # numpy flattens nested lists itself and refuses ragged ones.
        values = np.array(item.data)
    except (ValueError, TypeError) as exc:
        depth = _depth(item.data)
        if depth > max(len(item.shape), 1):
            raise ProtocolError(
                f"{where}: data nests {depth} arrays deep, shape {item.shape} has "
                f"{len(item.shape)} dimensions; send it flat or nested as the shape"
            ) from exc
        raise ProtocolError(
            f"{where}: data must be a flat or rectangular nested array of {item.datatype} values"
        ) from exc
    _check_count(values.size, count, item, where)
    dtype = NUMPY_DTYPES[item.datatype]
    if count and values.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        raise ProtocolError(
            f"{where}: data holds values that are not {item.datatype} "
            f"({json_type_error(item.datatype)})"
        )
    if dtype.kind in "iu" and count:
        limits = np.iinfo(dtype)
        if values.min() < limits.min or values.max() > limits.max:
            raise ProtocolError(f"{where}: data holds values out of range for {item.datatype}")
    return values.astype(dtype).tobytes()


def _depth(data: Any) -> int:
    """How deep the first elements of ``data`` nest (only to explain a refusal)."""
    depth = 0
    while isinstance(data, list):
        depth += 1
        data = data[0] if data else None
    return depth


def _check_count(found: int, count: int, item: _InputHeader, where: str) -> None:
    if found != count:
        raise ProtocolError(f"{where}: data has {found} elements, shape {item.shape} needs {count}")


def _batch_size(inputs: dict[str, Tensor], max_batch: int, model: str) -> int:
    if max_batch == 0 or not inputs:
        return 1
    sizes = [tensor.shape[0] for tensor in inputs.values()]
    if sizes.count(sizes[0]) != len(sizes):
        described = ", ".join(f"{name}={t.shape[0]}" for name, t in inputs.items())
        raise ProtocolError(f"model '{model}': inputs disagree on the batch size ({described})")
    return sizes[0]


def _requested_outputs(
    outputs: list[_OutputHeader] | None, config: ModelConfig, model: str, shared: SharedTensors
) -> dict[str, Any]:
    """The ``outputs``, ``classifications`` and ``output_regions`` fields of the
    InferRequest."""
    if outputs is None:
        return {"outputs": None}
    specs = {tensor.name: tensor for tensor in config.output}
    requested: dict[str, bool | None] = {}
    classifications: dict[str, int] = {}
    regions: dict[str, TensorRegion] = {}
    for output in outputs:
        spec = specs.get(output.name)
        if spec is None:
            listed = ", ".join(sorted(specs)) or "none"
            raise ProtocolError(
                f"model '{model}': unknown output '{output.name}' (outputs: {listed})"
            )
        where = f"model '{model}': output '{output.name}'"
        parameters = output.parameters or {}
        binary = parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise ProtocolError(f"{where}: binary_data must be a bool")
        requested[output.name] = binary
        count = parameters.get("classification", 0)
        if type(count) is not int or count < 0:
            raise ProtocolError(f"{where}: classification must be an int >= 0 (classes to return)")
        if count and spec.datatype in UNRANKED:
            raise ProtocolError(
                f"{where}: classification needs a numeric output, this one is {spec.datatype}"
            )
        if count:
            classifications[output.name] = count
        place = tensor_region(parameters, where)
        if place is not None:
            # Triton's rules: the output goes to the region, so neither in the body nor
            # as classes (which are made from the output, not written to it).
            if binary or count:
                other = "binary_data" if binary else "classification"
                raise ProtocolError(f"{where}: set {REGION} or {other}, not both")
            shared.reserve(place, where)
            regions[output.name] = place
    return {"outputs": requested, "classifications": classifications, "output_regions": regions}


def _request_parameters(
    parameters: dict[str, Any] | None, config: ModelConfig, model: str
) -> dict[str, Any]:
    parameters = parameters or {}
    binary = parameters.get("binary_data_output", False)
    if not isinstance(binary, bool):
        raise ProtocolError(f"model '{model}': parameter binary_data_output must be a bool")
    batching = config.dynamic_batching
    levels = batching.priority_levels if batching else 0
    priority = parameters.get("priority", 0)
    if type(priority) is not int or priority < 0 or (priority > levels and priority != 0):
        raise ProtocolError(
            f"model '{model}': parameter priority must be an int in 1..{levels} "
            "(or 0 for the default level)"
            if levels
            else f"model '{model}': parameter priority needs dynamic_batching.priority_levels"
        )
    timeout = parameters.get("timeout", 0)
    if type(timeout) is not int or timeout < 0:
        raise ProtocolError(f"model '{model}': parameter timeout must be microseconds >= 0")
    own = {key: value for key, value in parameters.items() if key not in _SERVER_PARAMETERS}
    return {
        "binary_output": binary,
        "priority": priority,
        "timeout_us": timeout,
        "parameters": own,
        **_sequence_parameters(parameters, model),
    }


def _sequence_parameters(parameters: dict[str, Any], model: str) -> dict[str, Any]:
    """The request's place in a sequence; a model without sequence batching ignores it,
    as Triton's does (its python models still read the correlation id)."""
    sequence_id = parameters.get("sequence_id", 0)
    if type(sequence_id) is int:
        if not 0 <= sequence_id <= _MAX_CORRELATION_ID:
            raise ProtocolError(
                f"model '{model}': parameter sequence_id must be an unsigned 64-bit int "
                f"or a string, got {sequence_id}"
            )
    elif type(sequence_id) is not str:
        raise ProtocolError(
            f"model '{model}': parameter sequence_id must be an unsigned 64-bit int or a string"
        )
    elif (
        len(sequence_id) > MAX_STRING_CORRELATION_ID  # the cheap test first
        or len(sequence_id.encode(errors="surrogatepass")) > MAX_STRING_CORRELATION_ID
    ):
        raise ProtocolError(
            f"model '{model}': parameter sequence_id is longer than the "
            f"{MAX_STRING_CORRELATION_ID}-byte limit of a string correlation id "
            f"(it begins {sequence_id[:_ECHOED]!r})"
        )
    flags = {}
    for key in ("sequence_start", "sequence_end"):
        flag = parameters.get(key, False)
        if not isinstance(flag, bool):
            raise ProtocolError(f"model '{model}': parameter {key} must be a bool")
        flags[key] = flag
    return {"sequence_id": sequence_id, **flags}
