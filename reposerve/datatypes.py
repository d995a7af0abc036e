"""V2 datatypes: their numpy dtypes, Triton config names, and the BYTES wire format.

Every tensor crosses reposerve as *raw wire bytes*: little-endian C-order elements for
fixed-size types, and for BYTES the binary tensor extension's framing (each element a
4-byte little-endian length followed by its bytes). The same layout is used on the HTTP
body, in shared memory, and in responses, so moving a tensor is a memcpy.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

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

T = TypeVar("T")

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


# The most elements one C-level loop (a map, a join, a list made an array) goes over: such
# a loop holds the GIL throughout, so over millions of elements every other thread (the
# front's event loop, answering health checks) would wait; between chunks they get turns.
C_LOOP_CHUNK = 1 << 16


def chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most C_LOOP_CHUNK."""
    return (items[start : start + C_LOOP_CHUNK] for start in range(0, len(items), C_LOOP_CHUNK))


_NONE = np.zeros(0, np.int64)


def _int64(values: list[int]) -> np.ndarray:
    return np.concatenate([np.array(part, np.int64) for part in chunks(values)] or [_NONE])


# After this many elements of one length in a row, the walk checks the rest of the run
# with numpy; shorter runs are walked in Python, one element at a time as they always
# were (irregular data costs about what it did, a flood of equal elements one numpy pass).
RUN_PROBE = 32


# Fewer elements than this with no run among them are read as plain offsets: for the few
# elements of a typical request, building numpy tables costs far more than the walk.
FEW_ELEMENTS = 1024


class ByteOffsets:
    """Where ``count`` BYTES elements lie, as the walk found them, one offset each: the
    few elements of a typical request (no run of equal lengths among them)."""

    __slots__ = ("count", "end", "offsets")

    def __init__(self, count: int, end: int, offsets: list[int]) -> None:
        self.count = count
        self.end = end  # where element ``count`` would start
        self.offsets = offsets

    def offset(self, index: int) -> int:
        """Where element ``index`` is framed (``count``: the end of the data)."""
        return self.offsets[index] if index < self.count else self.end

    def elements(self, raw: bytes | memoryview) -> np.ndarray:
        """The elements as a flat object array of ``bytes``."""
        view = memoryview(raw)
        starts = self.offsets
        array = np.empty(self.count, dtype=object)
        array[:] = [
            bytes(view[start + BYTES_LENGTH_SIZE : stop])
            for start, stop in zip(starts, [*starts[1:], self.end], strict=False)
        ]
        return array


class ByteRuns:
    """Where ``count`` BYTES elements lie in their wire bytes, as runs of consecutive
    elements of one length: run ``r`` holds ``counts[r]`` elements of ``lengths[r]``
    bytes each, the first framed at ``starts[r]``. A flood of equal elements (16 Mi empty
    ones, say) is one run, found and read back without a Python step per element."""

    __slots__ = ("count", "end", "starts", "lengths", "counts", "firsts")

    def __init__(self, count: int, end: int, singles: list[int], runs: list[int]) -> None:
        """``singles``: where each element outside runs is framed; ``runs``: start, length
        and count of each run, flat."""
        self.count = count
        self.end = end  # where element ``count`` would start
        table = np.reshape(_int64(runs), (-1, 3))
        alone = len(singles)
        starts = np.concatenate([_int64(singles), table[:, 0]])
        order = np.argsort(starts, kind="stable")  # two ascending lists, merged
        self.starts = starts[order]
        self.counts = np.concatenate([np.ones(alone, np.int64), table[:, 2]])[order]
        lengths = np.concatenate([np.full(alone, -1, np.int64), table[:, 1]])[order]
        # An element outside runs lasts until the next one is framed.
        following = np.append(self.starts[1:], self.end)
        self.lengths = np.where(lengths < 0, following - self.starts - BYTES_LENGTH_SIZE, lengths)
        self.firsts = np.cumsum(self.counts) - self.counts  # each run's first element

    def offset(self, index: int) -> int:
        """Where element ``index`` is framed (``count``: the end of the data)."""
        if index >= self.count:
            return self.end
        run = int(np.searchsorted(self.firsts, index, side="right")) - 1
        step = BYTES_LENGTH_SIZE + int(self.lengths[run])
        return int(self.starts[run]) + (index - int(self.firsts[run])) * step

    def elements(self, raw: bytes | memoryview) -> np.ndarray:
        """The elements as a flat object array of ``bytes``: a long run in one numpy step,
        the rest sliced by C iterators (``map``), no Python step per element."""
        data = np.frombuffer(raw, np.uint8)
        array = np.empty(self.count, dtype=object)
        long = self.counts >= RUN_PROBE
        for start, length, first, count in zip(
            self.starts[long].tolist(), self.lengths[long].tolist(),
            self.firsts[long].tolist(), self.counts[long].tolist(), strict=True,
        ):  # fmt: skip
            if length == 0:
                array[first : first + count] = b""  # a void dtype has no size 0
                continue
            step = BYTES_LENGTH_SIZE + length
            payloads: np.ndarray = np.ndarray(
                (count,), f"V{length}", data, start + BYTES_LENGTH_SIZE, (step,)
            )
            array[first : first + count] = payloads.tolist()  # bytes, NULs kept
        run, within = self._members(np.flatnonzero(~long))
        lengths = self.lengths[run]
        begins = self.starts[run] + within * (BYTES_LENGTH_SIZE + lengths) + BYTES_LENGTH_SIZE
        view = memoryview(raw)
        pieces = map(view.__getitem__, map(slice, begins.tolist(), (begins + lengths).tolist()))
        array[self.firsts[run] + within] = list(map(bytes, pieces))
        return array

    def _members(self, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each element of ``runs`` (run indices, ascending): its run, its place in it."""
        counts = self.counts[runs]
        run = np.repeat(runs, counts)
        before = np.repeat(np.cumsum(counts) - counts, counts)
        return run, np.arange(len(run), dtype=np.int64) - before


def byte_runs(raw: bytes | memoryview, count: int) -> ByteOffsets | ByteRuns:
    """The framing of ``count`` BYTES elements in ``raw``, checked.

    Raises ValueError when ``raw`` does not hold exactly ``count`` well-framed elements,
    so a lying length prefix can never make us read past the buffer. Once RUN_PROBE
    elements in a row had one length, the run goes on with numpy comparisons over the
    length fields where the next elements would be (in windows that double, so a run
    costs about its own size); irregular stretches are walked in Python.
    """
    end = raw.nbytes if isinstance(raw, memoryview) else len(raw)
    unpack = _LENGTH.unpack_from
    singles: list[int] = []
    runs: list[int] = []
    position = done = same = 0
    previous = -1
    while done < count:
        if position + BYTES_LENGTH_SIZE > end:
            raise ValueError(f"holds fewer than {count} elements ({done} found)")
        (length,) = unpack(raw, position)
        step = BYTES_LENGTH_SIZE + length
        if position + step > end:
            raise ValueError(f"element {done} claims {length} bytes, past the end of the data")
        same = same + 1 if length == previous else 0
        previous = length
        if same < RUN_PROBE:
            singles.append(position)
            position += step
            done += 1
            continue
        most = min(count - done, (end - position) // step)
        run = _run_length(np.frombuffer(raw, np.uint8), position, length, most)
        runs += (position, length, run)
        position += run * step
        done += run
        same = 0
    if position != end:
        raise ValueError(f"has {end - position} bytes left over after {count} elements")
    if not runs and count < FEW_ELEMENTS:
        return ByteOffsets(count, end, singles)
    return ByteRuns(count, end, singles, runs)


def _run_length(data: np.ndarray, position: int, length: int, most: int) -> int:
    """How many of the (at most ``most``) elements framed every ``4 + length`` bytes from
    ``position`` carry ``length``: the first does."""
    step = BYTES_LENGTH_SIZE + length
    run, window = 1, RUN_PROBE
    while run < most:
        window = min(2 * window, most - run)
        fields: np.ndarray = np.ndarray((window,), "<u4", data, position + run * step, (step,))
        differs = np.flatnonzero(fields != length)
        if len(differs):
            return run + int(differs[0])
        run += window
    return run


def pack_bytes(items: Iterable[bytes]) -> bytes:
    """Frame BYTES elements in the wire format (C iterators, a chunk at a time)."""
    items = items if isinstance(items, list | tuple) else list(items)
    if len(items) <= C_LOOP_CHUNK:
        return _pack_chunk(items)
    return b"".join(map(_pack_chunk, chunks(items)))


def _pack_chunk(items: Sequence[bytes]) -> bytes:
    lengths = map(_LENGTH.pack, map(len, items))
    return b"".join(itertools.chain.from_iterable(zip(lengths, items, strict=True)))


def unpack_bytes(raw: bytes | memoryview, count: int) -> list[bytes]:
    """The ``count`` elements framed in ``raw`` as bytes objects (validated)."""
    return byte_runs(raw, count).elements(raw).tolist()


def to_numpy(datatype: str, shape: tuple[int, ...], raw: bytes | memoryview) -> np.ndarray:
    """A numpy array over wire bytes: a view for fixed-size types, objects for BYTES."""
    if datatype == "BYTES":
        return byte_runs(raw, element_count(shape)).elements(raw).reshape(shape)
    return np.frombuffer(raw, dtype=NUMPY_DTYPES[datatype]).reshape(shape)


def to_wire(datatype: str, array: np.ndarray) -> bytes | memoryview:
    """Wire bytes of an array already in ``datatype``'s dtype (BYTES: framed elements)."""
    if datatype == "BYTES":
        return pack_bytes(_as_bytes(item) for item in array.reshape(-1))
    contiguous = np.ascontiguousarray(array)
    if contiguous.size == 0:
        return b""  # memoryview cannot cast a view with a 0 in its shape
    return contiguous.data.cast("B")


def _as_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, np.bytes_ | bytearray | memoryview):
        return bytes(item)
    raise TypeError(f"BYTES elements must be bytes or str, got {type(item).__name__}")
