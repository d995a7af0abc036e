"""Request messages as the gRPC front receives them: parsed by our own deserializer, so
bytes protobuf cannot parse are the client's error (INVALID_ARGUMENT, and inside a
ModelStreamInfer call only that message's), not a deserializer crash that gRPC reports as
UNKNOWN and that would end a whole stream. Status messages are cut to a length every
client takes in its trailers, however long a client string they echo.

Large messages leave memory behind that nothing hands back by itself: gRPC's and
protobuf's buffers freed into the C heap stay resident, and a request kept in a reference
cycle (an exception's frames, a closure) waits for Python's rare full collection. So once
the front has been quiet for a moment after a large message, ``Reclaimer`` runs a full
collection and gives the free heap back to the system (``malloc_trim``).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

log = logging.getLogger("reposerve.grpc")

LARGE_MESSAGE = 16 << 20  # bytes: a message after which memory is reclaimed
QUIET_S = 1.0  # seconds without a large message before reclaiming

# gRPC clients refuse trailers past 8 KiB by default; the status message rides in them.
MAX_STATUS_MESSAGE = 4096


class Undecodable:
    """A request message that could not be parsed, and why."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


class Reclaimer:
    """Gives back what large messages left behind, once they stop coming (see above)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._trim = _malloc_trim()
        self.reclaimed = 0  # times it ran

    def saw(self, size: int) -> None:
        """A message of ``size`` bytes arrived (on any thread)."""
        if size >= LARGE_MESSAGE:
            self._loop.call_soon_threadsafe(self._arm)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(QUIET_S, self._reclaim)

    def _reclaim(self) -> None:
        self._timer = None
        gc.collect()
        self.reclaimed += 1
        if self._trim is not None:  # it takes no GIL: off the loop
            self._loop.run_in_executor(None, self._trim, 0)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, where there is one."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        log.debug("no malloc_trim here: freed heap memory stays with the process")
        return None


def deserializer(message_class: Any, reclaimer: Reclaimer | None = None) -> Callable[[bytes], Any]:
    """``message_class.FromString``, with an Undecodable for bytes it cannot parse; each
    message's size is told to ``reclaimer``."""
    name = message_class.DESCRIPTOR.name

    def parse(data: bytes) -> Any:
        if reclaimer is not None:
            reclaimer.saw(len(data))
        try:
            return message_class.FromString(data)
        except (DecodeError, RecursionError) as exc:
            return Undecodable(f"could not decode the {name} message: {exc}")

    return parse


def status_message(message: str) -> str:
    """``message`` cut to fit a status (the cut said so)."""
    if len(message) <= MAX_STATUS_MESSAGE:
        return message
    cut = len(message) - MAX_STATUS_MESSAGE
    return f"{message[:MAX_STATUS_MESSAGE]}... ({cut} more characters cut)"
