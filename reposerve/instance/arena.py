"""Shared-memory slots: the buffers tensors cross between the front and an instance.

A slot is an anonymous memfd that both processes map. The front writes a batch's inputs
at the start of a slot; the instance writes the outputs after them and, when they do not
fit, grows the file and says its new size in the result. Whoever sees a size it has not
mapped yet maps the file again. Being anonymous, a slot can never be left behind in
/dev/shm: it is gone when the last process holding it exits. Every slot is sealed against
shrinking: model code can grow one, never cut it under the other process's mapping (which
would kill that process with SIGBUS).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat

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
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        return cls(fd, size)

    @classmethod
    def open_shared(cls, path: str, size: int) -> Slot:
        """Another process's slot, by a path to its fd (/proc/PID/fd/N), which must be a
        slot: a memfd sealed against shrinking, at least ``size`` bytes. Anything else
        (a file the process opened, a pipe) is an OSError, never opened for writing."""
        # Checked on the descriptor itself, before anything is written through it.
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(f"{path} is not shared memory")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:  # EINVAL: a file other than a sealable memfd
                raise OSError(f"{path} is not shared memory") from None
            if not seals & fcntl.F_SEAL_SHRINK or info.st_size < size:
                raise OSError(f"{path} is not a slot of {size} bytes")
            try:
                return cls(fd, size)
            except ValueError as exc:  # mmap of an empty file
                raise OSError(f"{path}: {exc}") from exc
        except OSError:
            os.close(fd)
            raise

    def remap(self, size: int) -> None:
        """Follow a size the other side set. Old mappings live on while views use them."""
        if size != self.size:
            self._check_open()
            if os.fstat(self.fd).st_size < size:
                raise OSError(f"the slot is {os.fstat(self.fd).st_size} bytes, not {size}")
            self.size = size
            self.buffer = mmap.mmap(self.fd, size)

    def ensure(self, needed: int) -> None:
        """Grow the file (and this mapping) to hold ``needed`` bytes. The other side may
        have grown it already, past what this side has mapped: then it is mapped as it
        is (a shrink would be refused by the seal)."""
        if needed > self.size:
            self._check_open()
            size = os.fstat(self.fd).st_size
            if size < needed:
                size = grown_size(needed)
                os.ftruncate(self.fd, size)
            self.remap(size)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1  # its number may be another file's from now on

    def _check_open(self) -> None:
        if self.fd < 0:
            raise OSError("the slot was closed (its process is gone)")
