"""Shared-memory slots: the buffers tensors cross between the front and an instance.

A slot is an anonymous memfd that both processes map. The front writes a batch's inputs
at the start of a slot; the instance writes the outputs after them and, when they do not
fit, grows the file and says its new size in the result. Whoever sees a size it has not
mapped yet maps the file again. Being anonymous, a slot can never be left behind in
/dev/shm: it is gone when the last process holding it exits.
"""

from __future__ import annotations

import mmap
import os

ALIGNMENT = 64
INITIAL_SLOT_SIZE = 1 << 20


def align(offset: int) -> int:
    return (offset + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


def grown_size(needed: int) -> int:
    """Sizes double so a growing workload remaps a handful of times, not every batch."""
    size = INITIAL_SLOT_SIZE
    while size < needed:
        size *= 2
    return size


class Slot:
    """One memfd and this process's current mapping of it."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.buffer = mmap.mmap(fd, size)

    @classmethod
    def create(cls, name: str, size: int = INITIAL_SLOT_SIZE) -> Slot:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return cls(fd, size)

    def remap(self, size: int) -> None:
        """Follow a size the other side set. Old mappings live on while views use them."""
        if size != self.size:
            self.size = size
            self.buffer = mmap.mmap(self.fd, size)

    def ensure(self, needed: int) -> None:
        """Grow the file (and this mapping) to hold ``needed`` bytes."""
        if needed > self.size:
            size = grown_size(needed)
            os.ftruncate(self.fd, size)
            self.remap(size)

    def close(self) -> None:
        os.close(self.fd)
