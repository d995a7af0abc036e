"""The scheduler's one seam to time: now, and callbacks later.

Production uses the event loop's timers over ``time.monotonic_ns``; tests pass a fake
clock they advance by hand, so batching and timeouts are checked without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> int:
        """Monotonic nanoseconds."""
        ...

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> Timer: ...


class LoopClock:
    def now(self) -> int:
        return time.monotonic_ns()

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay_ns / 1e9, callback)
