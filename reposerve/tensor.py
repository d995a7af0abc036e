"""The one tensor value that moves through the front, scheduler and instances."""

from __future__ import annotations

import msgspec

from reposerve.datatypes import bytes_offsets, element_count, item_size


class Tensor(msgspec.Struct, frozen=True):
    """A tensor as raw wire bytes (see ``reposerve.datatypes``) with its V2 datatype and shape.

    ``raw`` is usually a memoryview into a request body or an instance's shared memory, so
    holding a Tensor never implies a copy.
    """

    datatype: str
    shape: tuple[int, ...]
    raw: bytes | memoryview


def split_batch(tensor: Tensor, sizes: list[int]) -> list[Tensor]:
    """Views of ``tensor`` cut along axis 0 into consecutive pieces of ``sizes`` items."""
    if len(sizes) == 1 and tensor.shape[:1] == (sizes[0],):
        return [tensor]  # one piece, the whole: nothing to walk (BYTES take a walk to cut)
    per_item = element_count(tensor.shape[1:])
    rest = tensor.shape[1:]
    raw = tensor.raw
    pieces: list[Tensor] = []
    if tensor.datatype == "BYTES":
        offsets = bytes_offsets(raw, tensor.shape[0] * per_item)
        first = 0
        for size in sizes:
            last = first + size * per_item
            pieces.append(Tensor("BYTES", (size, *rest), raw[offsets[first] : offsets[last]]))
            first = last
        return pieces
    stride = per_item * item_size(tensor.datatype)
    start = 0
    for size in sizes:
        end = start + size * stride
        pieces.append(Tensor(tensor.datatype, (size, *rest), raw[start:end]))
        start = end
    return pieces
