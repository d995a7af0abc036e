"""Which queued requests leave together: the dynamic batcher's rules, as a pure function.

The scheduler calls ``plan_batch`` only when an instance is free, with the item counts
of the requests at the head of the queue that may share a batch. Requests are packed
whole and in order, never split.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from reposerve.config import ModelConfig


class BatchRules(msgspec.Struct, frozen=True):
    batching: bool
    max_batch_size: int
    preferred: frozenset[int]
    largest_preferred: int
    max_delay_ns: int

    @property
    def full_size(self) -> int:
        """Items a batch needs before it can be full (besides a shape change ending it)."""
        if not self.batching:
            return 1
        return self.largest_preferred or self.max_batch_size

    @classmethod
    def from_config(cls, config: ModelConfig) -> BatchRules:
        batching = config.dynamic_batching
        if batching is None:
            return cls(False, max(config.max_batch_size, 1), frozenset(), 0, 0)
        preferred = frozenset(batching.preferred_batch_size)
        return cls(
            batching=True,
            max_batch_size=config.max_batch_size,
            preferred=preferred,
            largest_preferred=max(preferred, default=0),
            max_delay_ns=batching.max_queue_delay_microseconds * 1000,
        )


class Take(msgspec.Struct, frozen=True):
    """Send the first ``count`` requests now; ``full``: the batch could not grow by
    waiting (so it may be staged on a busy instance rather than wait for a free one)."""

    count: int
    full: bool = False


class Wait(msgspec.Struct, frozen=True):
    """Form nothing yet; look again after ``ns`` unless something changes first."""

    ns: int


def plan_batch(sizes: Sequence[int], oldest_waited_ns: int, rules: BatchRules) -> Take | Wait:
    """Decide for the compatible queue head ``sizes`` (items per request, oldest first).

    - Without dynamic batching every request runs alone.
    - A batch that cannot grow (max_batch_size reached, or the next request does not fit)
      or that reached the largest preferred size leaves at once.
    - Otherwise the largest preferred size that can be formed leaves at once.
    - Otherwise everything that fits leaves once the oldest request has waited
      max_queue_delay; before that, we wait.
    """
    if not rules.batching:
        return Take(1, full=True)
    total = 0
    count = 0
    preferred_count = preferred_total = 0
    for size in sizes:
        if total + size > rules.max_batch_size:
            break
        total += size
        count += 1
        if total in rules.preferred:
            preferred_count, preferred_total = count, total
    if count == 0:
        return Take(1, full=True)
    cannot_grow = total == rules.max_batch_size or count < len(sizes)
    if cannot_grow or total == rules.largest_preferred:
        return Take(count, full=True)
    if preferred_count:
        return Take(preferred_count, full=preferred_total == rules.largest_preferred)
    if oldest_waited_ns >= rules.max_delay_ns:
        return Take(count)
    return Wait(rules.max_delay_ns - oldest_waited_ns)


def split_for_isolation(requests: int) -> tuple[int, ...]:
    """How to re-run a failed batch of ``requests`` to find the request(s) at fault.

    A batch of one request cannot be narrowed: it fails (empty result). A larger one is
    run again as two halves, so a single bad request among n is found in about 2·log2(n)
    extra executions, and every request that did nothing wrong still gets its result.
    """
    if requests < 2:
        return ()
    half = requests // 2
    return (half, requests - half)
