"""The live instances of one scheduler, and which of them takes the next batch."""

from __future__ import annotations

from collections.abc import Sequence

from reposerve.scheduler.work import Executor


class Instances:
    def __init__(self, instances: Sequence[Executor]) -> None:
        self._live = list(instances)
        self._rotation = 0  # where the next look starts: equal ones take turns

    def __bool__(self) -> bool:
        return bool(self._live)

    def add(self, instance: Executor) -> None:
        self._live.append(instance)

    def remove(self, instance: Executor) -> None:
        if instance in self._live:
            self._live.remove(instance)

    def free(self, staged: bool) -> Executor | None:
        """The least busy instance that takes a batch now (or, ``staged``, next)."""
        best: Executor | None = None
        count = len(self._live)
        for step in range(count):
            instance = self._live[(self._rotation + step) % count]
            if instance.has_capacity(staged) and (
                best is None or instance.in_flight < best.in_flight
            ):
                best = instance
        if best is not None:
            self._rotation = (self._rotation + 1) % count
        return best
