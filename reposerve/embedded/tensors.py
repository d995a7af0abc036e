"""numpy arrays in, numpy arrays out: an embedded call's inputs as the V2 request's
header and raw tensors (the form gRPC carries, checked as every request is), and its
answers as arrays of their own, copied out before the batch's memory is let go."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import msgspec
import numpy as np

from reposerve.answers import Answer
from reposerve.datatypes import NUMPY_DTYPES, to_numpy, to_wire
from reposerve.errors import EmbeddedError
from reposerve.front_service import FrontService

# A dtype's V2 datatype; BF16 has no numpy dtype of its own (its bits ride in uint16).
_DATATYPES = {dtype: name for name, dtype in NUMPY_DTYPES.items() if name not in ("BF16", "BYTES")}
# name -> numpy array (or what np.asarray makes one of), or a RawTensor
Inputs = Mapping[str, Any]
Version = str | int | None  # a model version, as V2 names it or as its number; None: latest


class CallOptions(TypedDict, total=False):
    """What a call may say beside its model and inputs."""

    version: Version  # the version to run (default: the model's policy's newest)
    outputs: Sequence[str] | None  # the outputs to return (default: all)
    # The request's parameters, as V2 has them: ``priority``, ``timeout``, a sequence's
    # ``sequence_id``, ``sequence_start`` and ``sequence_end``, and the model's own.
    parameters: Mapping[str, Any] | None
    request_id: str | None


class RawTensor(msgspec.Struct, frozen=True):
    """An input already in the wire's form: its V2 datatype, its shape and its bytes
    (BYTES: each element's length, 4 bytes little-endian, then the element), sent as they
    are; for callers that hold tensors as typed memory rather than as arrays (BF16)."""

    datatype: str
    shape: list[int]
    raw: bytes | memoryview


class InferResult(msgspec.Struct, frozen=True):
    """One response: its outputs as arrays (BYTES as arrays of bytes objects), its
    parameters, the model version that answered, and whether it is the request's last."""

    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    id: str | None = None
    final: bool = True


def version_text(version: Version) -> str | None:
    """A version as V2 names it (a number is its decimal text)."""
    return str(version) if isinstance(version, int) else version


def datatype_of(name: str, array: np.ndarray) -> str:
    """The V2 datatype of an input array (little-endian, as the wire is): its dtype's,
    BYTES for bytes, str or objects."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    datatype = _DATATYPES.get(array.dtype)
    if datatype is None:
        raise EmbeddedError(f"input '{name}': numpy dtype {array.dtype} has no V2 datatype")
    return datatype


def request_parts(
    inputs: Inputs, options: CallOptions
) -> tuple[dict[str, Any], list[bytes | memoryview]]:
    """The V2 header (inputs without data) and each input's raw bytes, in order."""
    described: list[dict[str, Any]] = []
    raws: list[bytes | memoryview] = []
    for name, value in inputs.items():
        if isinstance(value, RawTensor):
            described.append({"name": name, "datatype": value.datatype, "shape": value.shape})
            raws.append(value.raw)
            continue
        array = np.asarray(value)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        datatype = datatype_of(name, array)
        try:
            raw = to_wire(datatype, array)
        except TypeError as exc:  # a BYTES element that is neither bytes nor str
            raise EmbeddedError(f"input '{name}': {exc}") from None
        described.append({"name": name, "datatype": datatype, "shape": list(array.shape)})
        raws.append(raw)
    header: dict[str, Any] = {"inputs": described}
    if (outputs := options.get("outputs")) is not None:
        if isinstance(outputs, str):
            raise EmbeddedError(f"outputs: a list of output names, got the string {outputs!r}")
        header["outputs"] = [{"name": name} for name in outputs]
    if parameters := options.get("parameters"):
        header["parameters"] = dict(parameters)
    if (request_id := options.get("request_id")) is not None:
        header["id"] = request_id
    return header, raws


def result_of(name: str, answer: Answer) -> InferResult:
    """``answer`` as arrays of its own (the caller releases the answer)."""
    outputs = {}
    for output, tensor in answer.tensors:
        array = to_numpy(tensor.datatype, tensor.shape, tensor.memory())
        outputs[output] = array if tensor.datatype == "BYTES" else array.copy()
    return InferResult(
        name, answer.version, outputs, dict(answer.parameters), answer.request_id, answer.final
    )


async def infer_arrays(
    service: FrontService,
    model: str,
    options: CallOptions,
    header: dict[str, Any],
    raws: Sequence[bytes | memoryview],
) -> InferResult:
    """One request on ``service``, its parts made by ``request_parts``, answered as
    arrays."""
    version = version_text(options.get("version"))
    answer = await service.infer_parts(model, version, header, raws)
    with answer:
        return result_of(model, answer)
