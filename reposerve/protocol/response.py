"""Encode a V2 infer response: JSON tensors, or a JSON header followed by binary data."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from reposerve.datatypes import NUMPY_DTYPES, element_count, unpack_bytes
from reposerve.errors import ProtocolError
from reposerve.tensor import Tensor


class _OutputJSON(msgspec.Struct, omit_defaults=True):
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any = msgspec.UNSET
    parameters: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class _ResponseJSON(msgspec.Struct, omit_defaults=True):
    model_name: str
    model_version: str
    outputs: list[_OutputJSON]
    id: str | msgspec.UnsetType = msgspec.UNSET
    parameters: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


_encoder = msgspec.json.Encoder()
_FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64", "BF16"})


def encode_response(
    model: str,
    version: str,
    request_id: str | None,
    outputs: list[tuple[str, Tensor, bool]],
    parameters: dict[str, Any] | None = None,
    shared: frozenset[str] = frozenset(),
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length.

    ``outputs`` lists (name, tensor, binary) in response order; ``parameters`` are the
    response's own (those the model set); ``shared``: the outputs that were written into
    client shared memory, which carry no data here.
    """
    described: list[_OutputJSON] = []
    binary_parts: list[bytes | memoryview] = []
    for name, tensor, binary in outputs:
        if name in shared:
            # Name, datatype and shape alone, as Triton's HTTP server writes an output in
            # shared memory (http_server.cc, FinalizeResponse): its C++ client reads any
            # output "parameters" as a binary output's, and perf_analyzer fails on them.
            described.append(_OutputJSON(name, tensor.datatype, tensor.shape))
        elif binary:
            described.append(
                _OutputJSON(
                    name,
                    tensor.datatype,
                    tensor.shape,
                    parameters={"binary_data_size": len(tensor.raw)},
                )
            )
            binary_parts.append(tensor.memory())
        else:
            described.append(
                _OutputJSON(
                    name, tensor.datatype, tensor.shape, data=json_values(model, name, tensor)
                )
            )
    header = _encoder.encode(
        _ResponseJSON(
            model,
            version,
            described,
            msgspec.UNSET if request_id is None else request_id,
            parameters or msgspec.UNSET,
        )
    )
    # Only a non-finite float (or a string holding "null") writes null: check closely then.
    if b"null" in header:
        refuse_non_finite(model, outputs)
    if not binary_parts:
        return header, None
    return b"".join([header, *binary_parts]), len(header)


def json_values(model: str, name: str, tensor: Tensor) -> list:
    """A tensor's elements, flat, as JSON values (BYTES as UTF-8 text)."""
    count = element_count(tensor.shape)
    if tensor.datatype == "BYTES":
        try:
            return [item.decode() for item in unpack_bytes(tensor.memory(), count)]
        except UnicodeDecodeError as exc:
            raise ProtocolError(
                f"model '{model}': output '{name}' holds non-UTF-8 bytes, which JSON cannot "
                "carry; request it with binary_data"
            ) from exc
    values = np.frombuffer(tensor.memory(), dtype=NUMPY_DTYPES[tensor.datatype], count=count)
    if tensor.datatype == "BF16":
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return values.tolist()


def refuse_non_finite(model: str, outputs: list[tuple[str, Tensor, bool]]) -> None:
    """JSON has no NaN or infinity (msgspec writes null); name the output that holds one."""
    for name, tensor, binary in outputs:
        if binary or tensor.datatype not in _FLOAT_TYPES:
            continue
        values = np.frombuffer(tensor.memory(), dtype=NUMPY_DTYPES[tensor.datatype])
        if tensor.datatype == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        if not np.isfinite(values).all():
            raise ProtocolError(
                f"model '{model}': output '{name}' holds NaN or infinity, which JSON cannot "
                "carry; request it with binary_data"
            )
