"""The front's mappings of one instance process's call slots: the memfds its models write
model calls' inputs into (``calls``), opened through /proc by the number the process
names them with, and let go when the process shrinks its pool or ends."""

from __future__ import annotations

import os

from reposerve.instance.arena import Slot
from reposerve.instance.messages import Call


class CallSlots:
    def __init__(self) -> None:
        self._slots: dict[int, Slot] = {}  # by the process's fd

    def open(self, pid: int | None, call: Call) -> Slot:
        """The shared memory ``call``'s inputs lie in (opened once per memfd; mapped again
        when the process grew it). Raises OSError once it is gone."""
        path = f"/proc/{pid}/fd/{call.fd}"
        slot = self._slots.get(call.fd)
        # The number may name another file of the process by now: the same file or none.
        if slot is None or os.stat(path).st_ino != os.fstat(slot.fd).st_ino:
            if slot is not None:
                slot.close()
            slot = self._slots[call.fd] = Slot.open_shared(path, call.slot_size)
        slot.remap(call.slot_size)
        return slot

    def closed(self, fd: int) -> None:
        """The process closed its memfd ``fd`` (it shrank its call slots)."""
        slot = self._slots.pop(fd, None)
        if slot is not None:
            slot.close()

    def close(self) -> None:
        for slot in self._slots.values():
            slot.close()
        self._slots.clear()
