"""The one tensor value that moves through the front, scheduler and instances."""

from __future__ import annotations

import os

import msgspec

from reposerve.datatypes import byte_runs, element_count, item_size


class FileUnreadable(OSError):
    """A ``FileWindow`` no longer holds its bytes: its file was cut short."""


class FileWindow:
    """Bytes of a file that someone else controls (a client's shared-memory object), read
    only when copied, with the kernel's ``preadv``: a file cut short meanwhile costs a short
    read and one request, where reading a mapping of it would cost the process (SIGBUS)."""

    __slots__ = ("fd", "offset", "nbytes", "label")

    def __init__(self, fd: int, offset: int, nbytes: int, label: str) -> None:
        self.fd = fd
        self.offset = offset
        self.nbytes = nbytes
        self.label = label  # names the file in errors

    def __len__(self) -> int:
        return self.nbytes

    def copy_into(self, target: memoryview) -> None:
        """Fill ``target`` (``nbytes`` long) with the window's bytes."""
        done = 0
        while done < self.nbytes:
            got = os.preadv(self.fd, [target[done:]], self.offset + done)
            if got <= 0:
                raise FileUnreadable(
                    f"{self.label}: holds {done} of the {self.nbytes} bytes it had when the "
                    "request came: the client cut its file short"
                )
            done += got

    def read(self) -> bytes:
        """A copy of the window's bytes."""
        buffer = bytearray(self.nbytes)
        self.copy_into(memoryview(buffer))
        return bytes(buffer)


class Tensor(msgspec.Struct, frozen=True):
    """A tensor as raw wire bytes (see ``reposerve.datatypes``) with its V2 datatype and shape.

    ``raw`` is usually a memoryview into a request body or an instance's shared memory, so
    holding a Tensor never implies a copy; an input in a client's shared memory is a
    ``FileWindow``, read when the batch is assembled.
    """

    datatype: str
    shape: tuple[int, ...]
    raw: bytes | memoryview | FileWindow

    def memory(self) -> bytes | memoryview:
        """``raw`` of a tensor whose bytes are in this process's memory, as every output's
        are: only an input can lie in a client's file, and that is read into the batch."""
        raw = self.raw
        if isinstance(raw, FileWindow):
            raise TypeError(f"{raw.label}: a tensor in a client's file, where bytes were due")
        return raw


def split_batch(tensor: Tensor, sizes: list[int]) -> list[Tensor]:
    """Views of ``tensor`` cut along axis 0 into consecutive pieces of ``sizes`` items."""
    if len(sizes) == 1 and tensor.shape[:1] == (sizes[0],):
        return [tensor]  # one piece, the whole: nothing to walk (BYTES take a walk to cut)
    per_item = element_count(tensor.shape[1:])
    rest = tensor.shape[1:]
    raw = tensor.memory()
    pieces: list[Tensor] = []
    if tensor.datatype == "BYTES":
        runs = byte_runs(raw, tensor.shape[0] * per_item)
        first = 0
        for size in sizes:
            last = first + size * per_item
            pieces.append(
                Tensor("BYTES", (size, *rest), raw[runs.offset(first) : runs.offset(last)])
            )
            first = last
        return pieces
    stride = per_item * item_size(tensor.datatype)
    start = 0
    for size in sizes:
        end = start + size * stride
        pieces.append(Tensor(tensor.datatype, (size, *rest), raw[start:end]))
        start = end
    return pieces
