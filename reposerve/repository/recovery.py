"""Bring dead instances back: a fresh process from the same spec.

An instance that dies fails exactly its in-flight batches (``InstanceProcess``); this
module then starts a replacement after a short delay that grows while the instance keeps
dying soon after each start, so a model that crashes on load or on every request does not
spin. Restarts stop when the version leaves READY.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from reposerve.errors import InstanceError
from reposerve.instance.process import InstanceProcess

log = logging.getLogger("reposerve.repository")

# Seconds before a restart, by how many times this instance died in the last minute.
RESTART_DELAYS = (0.05, 0.5, 2.0, 10.0)
CRASH_MEMORY_S = 60.0


class InstanceRestarter:
    def __init__(
        self,
        label: str,
        load_timeout: float,
        wanted: Callable[[], bool],
        replaced: Callable[[InstanceProcess, InstanceProcess], None],
        on_exit: Callable[[InstanceProcess], None],
    ) -> None:
        self._label = label
        self._load_timeout = load_timeout
        self._wanted = wanted  # whether the version still serves
        self._replaced = replaced  # (dead, replacement) once the replacement is READY
        self._on_exit = on_exit
        self._deaths: dict[int, list[float]] = {}
        self._tasks: set[asyncio.Task] = set()

    def restart(self, dead: InstanceProcess) -> None:
        now = time.monotonic()
        deaths = [t for t in self._deaths.get(dead.spec.index, []) if now - t < CRASH_MEMORY_S]
        deaths.append(now)
        self._deaths[dead.spec.index] = deaths
        delay = RESTART_DELAYS[min(len(deaths), len(RESTART_DELAYS)) - 1]
        task = asyncio.get_running_loop().create_task(self._restart(dead, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def _restart(self, dead: InstanceProcess, delay: float) -> None:
        index = dead.spec.index
        log.error("%s: instance %d died; restarting it in %g s", self._label, index, delay)
        await asyncio.sleep(delay)
        if not self._wanted():
            return
        replacement = InstanceProcess(dead.spec, self._on_exit)
        try:
            await replacement.start(self._load_timeout)
        except InstanceError as exc:
            log.error("%s: restarting instance %d failed: %s", self._label, index, exc.message)
            self.restart(dead)  # counts as another death: the next try waits longer
            return
        except asyncio.CancelledError:
            replacement.kill()
            raise
        if not self._wanted():
            replacement.kill()
            return
        self._replaced(dead, replacement)
        log.info("%s: instance %d is back (pid %s)", self._label, index, replacement.pid)
