"""Latency quantiles over a sliding time window, for Triton's ``*_summary_us`` metrics.

prometheus-client's Summary keeps no quantiles, so reposerve keeps its own: a log-bucketed
sketch (the DDSketch idea) that counts each value in the bucket ``ceil(log_gamma(v))``. A
value costs one ``log`` and one dict update; a weight (one batch's compute time counted
for each of its requests) costs no more; memory is bounded by the buckets a value range
spans (about 1,000 between 1 us and an hour at 1 %). Any quantile read back lies within
``RELATIVE_ERROR`` of the exact one's value, whatever the quantile, so the sketch records
without knowing which quantiles a scrape will ask for.

The window follows Prometheus' client libraries (prometheus-cpp, which Triton uses):
``AGE_BUCKETS`` sketches of ``WINDOW_NS / AGE_BUCKETS`` each; a value goes into the newest,
a read merges them all, and the oldest is dropped as time moves on, so a quantile covers the
last 48 to 60 s. ``count`` and ``total`` are cumulative, as a summary's ``_count``/``_sum``.
Not thread-safe: it is written and read on the event loop.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from math import ceil, log

RELATIVE_ERROR = 0.01
WINDOW_NS = 60_000_000_000  # prometheus-cpp's default max_age, which Triton keeps
AGE_BUCKETS = 5

_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_INVERSE_LOG_GAMMA = 1 / math.log(_GAMMA)
_ZERO = -(2**31)  # the bucket of values <= 0 (a queue wait of 0 us)


class WindowedQuantiles:
    def __init__(self, now_ns: int) -> None:
        self.count = 0
        self.total = 0.0
        self._slot_ns = WINDOW_NS // AGE_BUCKETS
        self._slot_end = now_ns + self._slot_ns
        self._slots: deque[dict[int, int]] = deque([{}], maxlen=AGE_BUCKETS)

    def add(self, value: float, weight: int = 1) -> None:
        """Count ``value`` ``weight`` times (call ``advance`` first when time has moved)."""
        key = ceil(log(value) * _INVERSE_LOG_GAMMA) if value > 0 else _ZERO
        slot = self._slots[-1]
        slot[key] = slot.get(key, 0) + weight
        self.count += weight
        self.total += value * weight

    def add_all(self, values: Sequence[int], scale: float) -> None:
        """Count each of ``values * scale`` once: ``add`` in one loop with locals, as the
        scheduler calls it for every request of every batch."""
        slot = self._slots[-1]
        inverse, total = _INVERSE_LOG_GAMMA, 0.0
        for raw in values:
            value = raw * scale
            key = ceil(log(value) * inverse) if value > 0 else _ZERO
            slot[key] = slot.get(key, 0) + 1
            total += value
        self.count += len(values)
        self.total += total

    def advance(self, now_ns: int) -> None:
        """Start new slots for the time passed since the last call, dropping the oldest."""
        if now_ns < self._slot_end:
            return
        passed = (now_ns - self._slot_end) // self._slot_ns + 1
        for _ in range(min(passed, AGE_BUCKETS)):
            self._slots.append({})  # maxlen drops the oldest
        self._slot_end += passed * self._slot_ns

    def quantiles(self, wanted: Iterable[float], now_ns: int) -> list[float]:
        """Each wanted quantile (0..1) of the values in the window; NaN for an empty window,
        as Prometheus' clients report it."""
        self.advance(now_ns)
        merged: dict[int, int] = {}
        for slot in self._slots:
            for key, count in slot.items():
                merged[key] = merged.get(key, 0) + count
        seen = sum(merged.values())
        if not seen:
            return [math.nan for _ in wanted]
        ordered = sorted(merged.items())
        results = []
        for quantile in wanted:
            # The nearest rank (0-based): the tail quantiles of a few values are their
            # largest, never an interpolation below them.
            rank = max(math.ceil(quantile * seen) - 1, 0)
            running = 0
            for key, count in ordered:
                running += count
                if running > rank:
                    results.append(_value(key))
                    break
        return results


def _value(key: int) -> float:
    """The bucket's representative: within RELATIVE_ERROR of anything counted in it."""
    if key == _ZERO:
        return 0.0
    return 2 * _GAMMA**key / (_GAMMA + 1)
