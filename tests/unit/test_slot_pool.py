"""The front's slot pool: slots taken and given back, new ones sent with their memfd, and
the pool shrinking to KEEP once the process has stayed idle (the newest slots go first,
their indices used again by the next new slots)."""

from __future__ import annotations

import asyncio

import pytest

from reposerve.framing import FrameReader
from reposerve.instance import slot_pool
from reposerve.instance.messages import AddSlot, DropSlot, ToInstance
from reposerve.instance.slot_pool import KEEP, SlotPool

pytestmark = pytest.mark.unit


class _Process:
    """What the pool sends, and whether the process is idle."""

    def __init__(self) -> None:
        self.added: list[int] = []
        self.dropped: list[int] = []
        self.busy = False
        self._reader = FrameReader(ToInstance)

    def send_with_fd(self, frame: bytes, fd: int) -> None:
        (message,) = self._reader.feed(frame)
        assert isinstance(message, AddSlot) and fd >= 0
        self.added.append(message.slot)

    def send(self, message: DropSlot) -> None:
        self.dropped.append(message.slot)

    def idle(self) -> bool:
        return not self.busy


def _pool(process: _Process) -> SlotPool:
    return SlotPool("m-0", process.send_with_fd, process.send, process.idle)


def test_a_burst_grows_the_pool_and_an_idle_moment_shrinks_it(monkeypatch):
    monkeypatch.setattr(slot_pool, "IDLE_S", 0.01)

    async def scenario() -> None:
        process = _Process()
        pool = _pool(process)
        process.busy = True
        taken = [pool.take() for _ in range(6)]
        assert taken == process.added == [0, 1, 2, 3, 4, 5]
        for index in taken[:-1]:
            pool.give_back(index)
        process.busy = False
        pool.give_back(taken[-1])  # idle now: the shrink is armed
        await asyncio.sleep(0.05)
        assert sorted(process.dropped) == [2, 3, 4, 5] and len(pool) == KEEP
        # A dropped index is the next new slot's.
        process.busy = True
        assert [pool.take() for _ in range(3)] in ([1, 0, 2], [0, 1, 2])
        assert process.added[-1] == 2
        pool.close()

    asyncio.run(scenario())


def test_busy_again_before_the_idle_moment_ends_keeps_the_slots(monkeypatch):
    monkeypatch.setattr(slot_pool, "IDLE_S", 0.01)

    async def scenario() -> None:
        process = _Process()
        pool = _pool(process)
        taken = [pool.take() for _ in range(4)]
        for index in taken:
            pool.give_back(index)  # idle: armed
        process.busy = True  # a batch came meanwhile
        await asyncio.sleep(0.05)
        assert process.dropped == [] and len(pool) == 4
        pool.close()

    asyncio.run(scenario())
