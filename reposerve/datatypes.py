"""V2 datatypes: their numpy dtypes, Triton config names, and the BYTES wire format.

Every tensor crosses reposerve as *raw wire bytes*: little-endian C-order elements for
fixed-size types, and for BYTES the binary tensor extension's framing (each element a
4-byte little-endian length followed by its bytes). The same layout is used on the HTTP
body, in shared memory, and in responses, so moving a tensor is a memcpy.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

# BF16 has no numpy dtype: its elements travel and reach models as their uint16 bit patterns.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "BYTES": np.dtype(object),
}
DATATYPES = tuple(NUMPY_DTYPES)

TRITON_CONFIG_TYPES: dict[str, str] = {
    name: ("TYPE_STRING" if name == "BYTES" else f"TYPE_{name}") for name in DATATYPES
}

_LENGTH = struct.Struct("<I")
BYTES_LENGTH_SIZE = _LENGTH.size


def item_size(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype; 0 for BYTES (variable)."""
    return 0 if datatype == "BYTES" else NUMPY_DTYPES[datatype].itemsize


def element_count(shape: Iterable[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def bytes_offsets(raw: bytes | memoryview, count: int) -> list[int]:
    """Start offsets of ``count`` BYTES elements in ``raw``, plus the end offset.

    Raises ValueError when ``raw`` does not hold exactly ``count`` well-framed elements,
    so a lying length prefix can never make us read past the buffer.
    """
    offsets = [0]
    position = 0
    end = len(raw)
    unpack = _LENGTH.unpack_from
    for _ in range(count):
        if position + BYTES_LENGTH_SIZE > end:
            raise ValueError(f"holds fewer than {count} elements ({len(offsets) - 1} found)")
        (length,) = unpack(raw, position)
        position += BYTES_LENGTH_SIZE + length
        if position > end:
            raise ValueError(
                f"element {len(offsets) - 1} claims {length} bytes, past the end of the data"
            )
        offsets.append(position)
    if position != end:
        raise ValueError(f"has {end - position} bytes left over after {count} elements")
    return offsets


def pack_bytes(items: Iterable[bytes]) -> bytes:
    """Frame BYTES elements in the wire format."""
    parts: list[bytes] = []
    for item in items:
        parts.append(_LENGTH.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def unpack_bytes(raw: bytes | memoryview, count: int) -> list[bytes]:
    """The ``count`` elements framed in ``raw`` as bytes objects (validated)."""
    offsets = bytes_offsets(raw, count)
    view = memoryview(raw)
    return [
        bytes(view[start + BYTES_LENGTH_SIZE : stop])
        for start, stop in zip(offsets, offsets[1:], strict=False)
    ]


def to_numpy(datatype: str, shape: tuple[int, ...], raw: bytes | memoryview) -> np.ndarray:
    """A numpy array over wire bytes: a view for fixed-size types, objects for BYTES."""
    if datatype == "BYTES":
        array = np.empty(element_count(shape), dtype=object)
        array[:] = unpack_bytes(raw, array.size)
        return array.reshape(shape)
    return np.frombuffer(raw, dtype=NUMPY_DTYPES[datatype]).reshape(shape)


def to_wire(datatype: str, array: np.ndarray) -> bytes | memoryview:
    """Wire bytes of an array already in ``datatype``'s dtype (BYTES: framed elements)."""
    if datatype == "BYTES":
        return pack_bytes(_as_bytes(item) for item in array.reshape(-1))
    contiguous = np.ascontiguousarray(array)
    if contiguous.size == 0:
        return b""  # memoryview cannot cast a view with a 0 in its shape
    return memoryview(contiguous).cast("B")


def _as_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, np.bytes_ | bytearray | memoryview):
        return bytes(item)
    raise TypeError(f"BYTES elements must be bytes or str, got {type(item).__name__}")
