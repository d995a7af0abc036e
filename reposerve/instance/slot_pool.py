"""The front's pool of one instance process's batch slots.

A batch takes a free slot, or a new one (its memfd sent to the process beside an AddSlot
frame); its answer gives the slot back. A burst of concurrency grows the pool, and every
slot holds descriptors and memory on both sides, so once the process has been idle for
IDLE_S the free slots beyond KEEP go (DropSlot), the newest first. Indices are the
frames' names for slots: a dropped one's index is used again by the next new slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from reposerve.instance.arena import Slot
from reposerve.instance.messages import AddSlot, DropSlot, encode_frame

KEEP = 2  # slots kept through an idle moment
IDLE_S = 2.0  # how long the process must be idle before the pool shrinks


class SlotPool:
    def __init__(
        self,
        name: str,
        send_with_fd: Callable[[bytes, int], None],
        send: Callable[[DropSlot], None],
        idle: Callable[[], bool],
    ) -> None:
        """``send_with_fd`` sends a frame with a descriptor beside its first byte, ``send``
        a frame, ``idle`` says whether the process runs nothing now."""
        self._name = name
        self._send_with_fd = send_with_fd
        self._send = send
        self._idle = idle
        self._slots: dict[int, Slot] = {}
        self._free: list[int] = []
        self._shrink: asyncio.TimerHandle | None = None

    def __getitem__(self, index: int) -> Slot:
        return self._slots[index]

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def has_free(self) -> bool:
        return bool(self._free)

    def take(self) -> int:
        """A free slot's index: one given back, else a new one."""
        return self._free.pop() if self._free else self._add()

    def grow(self) -> None:
        """One more free slot (the first, before any batch)."""
        self._free.append(self._add())

    def give_back(self, index: int) -> None:
        if index not in self._slots:  # read past the process's end: the pool is closed
            return
        self._free.append(index)
        if self._shrink is None and len(self._slots) > KEEP and self._idle():
            self._shrink = asyncio.get_running_loop().call_later(IDLE_S, self._drop_extra)

    def close(self) -> None:
        if self._shrink is not None:
            self._shrink.cancel()
            self._shrink = None
        for slot in self._slots.values():
            slot.close()
        self._slots.clear()
        self._free.clear()

    def _add(self) -> int:
        index = next(i for i in range(len(self._slots) + 1) if i not in self._slots)
        slot = Slot.create(f"reposerve-{self._name}-{index}")
        self._slots[index] = slot
        self._send_with_fd(encode_frame(AddSlot(index, slot.size)), slot.fd)
        return index

    def _drop_extra(self) -> None:
        """Still idle: free slots beyond KEEP go. Busy again: kept, until the next idle."""
        self._shrink = None
        if not self._idle():
            return
        self._free.sort()
        while len(self._slots) > KEEP and self._free:
            index = self._free.pop()
            self._slots.pop(index).close()
            self._send(DropSlot(index))
