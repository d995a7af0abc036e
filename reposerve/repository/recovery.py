"""Bring dead instances back: a fresh process from the same spec, until it is hopeless.

An instance that dies fails exactly its in-flight batches (``InstanceProcess``); this
module then starts a replacement (warmed up before it serves) after a short delay that
grows while the instance keeps dying soon after each start. An instance that dies
``MAX_DEATHS`` times within ``CRASH_WINDOW_S`` (a failed restart counts as a death; a kill
for one request that ran past the execution timeout does not) is in a crash loop:
restarts stop and the owner is told why (``gave_up``), so the model turns UNAVAILABLE with
the reason instead of burning a core on restarts forever. Restarts also stop when the
version leaves READY.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from reposerve.errors import ReposerveError
from reposerve.instance.process import InstanceProcess, OnCall

log = logging.getLogger("reposerve.repository")

# Seconds before a restart, by how many times this instance died within the window.
RESTART_DELAYS = (0.05, 0.25, 1.0, 2.0)
MAX_DEATHS = 5
CRASH_WINDOW_S = 60.0


class InstanceRestarter:
    def __init__(
        self,
        label: str,
        load_timeout: float,
        wanted: Callable[[], bool],
        replaced: Callable[[InstanceProcess, InstanceProcess], None],
        on_exit: Callable[[InstanceProcess], None],
        gave_up: Callable[[str], None],
        prepare: Callable[[InstanceProcess], Awaitable[None]],
        on_call: OnCall | None = None,
    ) -> None:
        self._label = label
        self._load_timeout = load_timeout
        self._wanted = wanted  # whether the version still serves
        self._replaced = replaced  # (dead, replacement) once the replacement is READY
        self._on_exit = on_exit
        self._gave_up = gave_up  # (why) once an instance is in a crash loop
        self._prepare = prepare  # runs on a replacement before it serves (warmup)
        self._on_call = on_call  # a model's calls to models, from any of its instances
        self._recent: dict[int, list[float]] = {}
        self._tasks: set[asyncio.Task] = set()
        self.deaths = 0  # exits and failed restarts, for the metrics

    def restart(self, dead: InstanceProcess) -> None:
        """``dead`` exited: replace it, unless it is in a crash loop."""
        if dead.batch_fault:  # it ended for one batch's sake: the model is healthy
            self.deaths += 1
            self._schedule(dead, RESTART_DELAYS[0])
        else:
            self._count_death(dead, dead.ended)

    def _count_death(self, dead: InstanceProcess, how: str) -> None:
        self.deaths += 1
        index = dead.spec.index
        now = time.monotonic()
        recent = [t for t in self._recent.get(index, []) if now - t < CRASH_WINDOW_S]
        recent.append(now)
        self._recent[index] = recent
        if len(recent) >= MAX_DEATHS:
            self._gave_up(
                f"instance {index} died {len(recent)} times within {CRASH_WINDOW_S:g} s "
                f"(last: {how}); it is not restarted again. Fix the model and load it again"
            )
            return
        self._schedule(dead, RESTART_DELAYS[min(len(recent), len(RESTART_DELAYS)) - 1])

    def _schedule(self, dead: InstanceProcess, delay: float) -> None:
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
        replacement = InstanceProcess(dead.spec, self._on_exit, self._on_call)
        try:
            await replacement.start(self._load_timeout)
            await self._prepare(replacement)
        except asyncio.CancelledError:
            replacement.kill()
            raise
        except Exception as exc:  # InstanceError, or an OS limit (EMFILE, EAGAIN, ENOSPC)
            replacement.kill()
            why = exc.message if isinstance(exc, ReposerveError) else f"{type(exc).__name__}: {exc}"
            log.error("%s: restarting instance %d failed: %s", self._label, index, why)
            self._count_death(dead, why)  # the next try waits longer
            return
        if not self._wanted():
            replacement.kill()
            return
        self._replaced(dead, replacement)
        log.info("%s: instance %d is back (pid %s)", self._label, index, replacement.pid)
