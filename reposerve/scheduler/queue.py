"""The queue of one scheduler: requests waiting, one deque per priority level, and the
counts dispatch reads on every arrival (how many wait, and their batch sizes summed).

It only holds: what a request's timer, its statistics and its answer become is the
scheduler's (``reposerve.scheduler.batcher``), which takes requests out through here so
the counts always match what waits.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator

from reposerve.config import DynamicBatching
from reposerve.scheduler.padding import Padding
from reposerve.scheduler.work import Queued, gather


class RequestQueue:
    def __init__(self, batching: DynamicBatching | None) -> None:
        levels = max(batching.priority_levels, 1) if batching else 1
        self._default_level = (batching.default_priority_level or levels) if batching else 1
        self.max_size = batching.max_queue_size if batching else 0  # 0: no limit
        self._levels: list[deque[Queued]] = [deque() for _ in range(levels)]
        self.count = 0
        self.items = 0  # their batch sizes summed: whether a full batch could form

    def __len__(self) -> int:
        return self.count

    @property
    def full(self) -> bool:
        return bool(self.max_size) and self.count >= self.max_size

    def append(self, item: Queued) -> None:
        """Queue ``item`` at the back of its priority level (the default one when its
        request names none)."""
        self._levels[(item.request.priority or self._default_level) - 1].append(item)
        self.count += 1
        self.items += item.request.batch_size

    def given_up(self) -> Iterator[Queued]:
        """Take out the requests at the front of each level whose callers gave up on
        them (the ones behind go once they reach the front)."""
        for level in self._levels:
            while level and level[0].future.done():
                item = level.popleft()
                self._counted_out(item)
                yield item

    def head(self, max_batch_size: int, padding: Padding | None) -> tuple[list[Queued], bool]:
        """The oldest requests that may share a batch, and whether another shape follows
        (call after ``given_up``, which clears the fronts)."""
        return gather(self._levels, max_batch_size, padding)

    def take(self, item: Queued) -> bool:
        """Take ``item`` out from wherever it waits; False when it does not wait here."""
        for level in self._levels:
            with contextlib.suppress(ValueError):
                level.remove(item)
                self._counted_out(item)
                return True
        return False

    def clear(self) -> Iterator[Queued]:
        """Take out everything, oldest first in each level, highest level first."""
        for level in self._levels:
            while level:
                item = level.popleft()
                self._counted_out(item)
                yield item

    def _counted_out(self, item: Queued) -> None:
        self.count -= 1
        self.items -= item.request.batch_size
