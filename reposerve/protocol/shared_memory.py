"""The shared-memory extension's wire forms (Triton's system shared memory): where a
tensor lies in a client's region, as its ``shared_memory_*`` parameters say, and the JSON
body of a register request. Pure parsing: the regions themselves, and every check against
them, are ``reposerve.shared_memory``'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

import msgspec

from reposerve.errors import ProtocolError
from reposerve.operations import SystemRegion
from reposerve.tensor import FileWindow

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
PARAMETERS = (REGION, BYTE_SIZE, OFFSET)


class TensorRegion(msgspec.Struct, frozen=True):
    """A tensor's bytes in a registered region: ``byte_size`` of them from ``offset``
    (both counted from the region's start)."""

    region: str
    byte_size: int
    offset: int = 0


class SharedTensors(Protocol):
    """Client shared memory as decoding a request uses it: one request's claims on the
    regions it names (``reposerve.shared_memory.Claims``)."""

    def read(self, place: TensorRegion, where: str) -> FileWindow:
        """The input's bytes, read when copied, checked to be there now."""
        ...

    def reserve(self, place: TensorRegion, where: str) -> None:
        """Hold the region an output will be written into."""
        ...


class Unavailable:
    """``SharedTensors`` for a call that cannot use client shared memory (a model's own
    calls to other models, the generate extension)."""

    def read(self, place: TensorRegion, where: str) -> FileWindow:
        raise self._refusal(where)

    def reserve(self, place: TensorRegion, where: str) -> None:
        raise self._refusal(where)

    @staticmethod
    def _refusal(where: str) -> ProtocolError:
        return ProtocolError(
            f"{where}: parameter {REGION} (the shared-memory extension) is not available on "
            "this call; send the tensor data with it"
        )


UNAVAILABLE = Unavailable()


def may_read_bytes(header: bytes | bytearray | memoryview | dict[str, Any]) -> bool:
    """Whether a request (its JSON header, or gRPC's as a dict) may put BYTES in a region:
    those are read and their framing walked while decoding, which a small body does not
    bound, so it is done off the event loop."""
    if not isinstance(header, dict):
        # (a memoryview, from a front process: copied; only its header, or a small body)
        text = header if isinstance(header, bytes) else bytes(header)
        return _REGION_BYTES in text and b'"BYTES"' in text
    return any(
        item.get("datatype") == "BYTES" and REGION in (item.get("parameters") or {})
        for item in header.get("inputs") or ()
    )


_REGION_BYTES = REGION.encode()


def tensor_region(parameters: dict[str, Any], where: str) -> TensorRegion | None:
    """Where a tensor's parameters place it; None when they name no region. A byte size or
    offset without a region, a region without a byte size, or values of the wrong type
    are refused (Triton's rules: the offset is optional, 0 by default)."""
    region = parameters.get(REGION)
    if region is None:
        for key in (BYTE_SIZE, OFFSET):
            if key in parameters:
                raise ProtocolError(f"{where}: parameter {key} needs {REGION} beside it")
        return None
    if not isinstance(region, str) or not region:
        raise ProtocolError(
            f"{where}: parameter {REGION} must be a registered region's name, got {region!r:.60}"
        )
    if BYTE_SIZE not in parameters:
        raise ProtocolError(f"{where}: parameter {BYTE_SIZE} must be given with {REGION}")
    size, offset = parameters[BYTE_SIZE], parameters.get(OFFSET, 0)
    for key, value in ((BYTE_SIZE, size), (OFFSET, offset)):
        if type(value) is not int or value < 0:
            raise ProtocolError(f"{where}: parameter {key} must be an int >= 0, got {value!r:.60}")
    return TensorRegion(region, size, offset)


_Size = Annotated[int, msgspec.Meta(ge=0)]


class _RegisterBody(msgspec.Struct):
    key: str
    byte_size: _Size
    offset: _Size = 0


_register_decoder = msgspec.json.Decoder(_RegisterBody)


def decode_register_request(name: str, body: bytes) -> SystemRegion:
    """``POST v2/systemsharedmemory/region/{name}/register``'s JSON body:
    ``{"key": "/name", "offset": int, "byte_size": int}`` (offset optional)."""
    try:
        decoded = _register_decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise ProtocolError(
            f"register system shared-memory region '{name}': the body must be JSON "
            f'{{"key": "/name", "offset": int, "byte_size": int}}: {exc}'
        ) from None
    return SystemRegion(name, decoded.key, decoded.offset, decoded.byte_size)
