"""Loads under the memory budgets: room is made before a load (idle models unloaded, least
recently used first), the load is measured, and what it took past a budget is trimmed
after. The decisions are ``residency.py``'s; this runs them against the repository.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import msgspec

from reposerve.errors import ErrorKind, RepositoryError
from reposerve.repository.footprints import Footprint, folder_bytes, measure
from reposerve.repository.residency import (
    Residency,
    Resident,
    choose_victims,
    describe_footprint,
    evictable,
    helps,
    refusal,
    residents_of,
)
from reposerve.repository.version import ModelState, ModelVersion

log = logging.getLogger("reposerve.repository")

Serving = dict[str, list[ModelVersion]]  # name -> its READY versions


class Loading(msgspec.Struct, frozen=True):
    """A load under way, and the room made for it, held until the load is measured.
    ``beside``: a reload, whose old version serves (and holds its memory) meanwhile."""

    name: str
    needed: Footprint
    beside: bool = False


class BudgetKeeper:
    """``serving`` lists the loaded models; ``unload(name, dependents)`` takes one out of
    service (an ensemble with the steps only it uses)."""

    def __init__(
        self,
        residency: Residency,
        roots: Sequence[Path],
        serving: Callable[[], Serving],
        unload: Callable[[str, bool], Awaitable[None]],
    ) -> None:
        self.residency = residency
        self._roots = roots
        self._serving = serving
        self._unload = unload
        self._budget = asyncio.Lock()  # budget decisions: one at a time
        self._loads: list[Loading] = []  # loads under way, by the room made for each
        self._measured_at = 0.0  # when refresh last measured
        self._measuring: asyncio.Future | None = None

    async def load(
        self, name: str, load_now: Callable[[], Awaitable[list[ModelVersion]]]
    ) -> list[ModelVersion]:
        """Run ``load_now`` (the load of ``name``) within the budgets; measured either
        way, for ``/stats`` and the index."""
        residency = self.residency
        if not residency.tracking:
            fresh = await load_now()
            serving = [v for v in fresh if v.state is ModelState.READY]
            if serving:
                await self._measure({name: serving})
            return fresh
        # Each stays in use until it is measured: no decision meanwhile evicts it, and
        # its room stays made for it (a model serving but not yet measured holds memory
        # no footprint says).
        with residency.in_use([name]):
            async with self._room(name):
                started = time.monotonic()
                fresh = await load_now()
                serving = [v for v in fresh if v.state is ModelState.READY]
                if serving:
                    async with self._budget:
                        measured = await self._measure({name: serving})
                        residency.loaded(
                            name, measured.get(name, Footprint()), time.monotonic() - started
                        )
                        if residency.budgeted:
                            await self._trim(name)
            return fresh

    @contextlib.asynccontextmanager
    async def _room(self, name: str) -> AsyncIterator[None]:
        """Under a budget, room made for ``name`` and kept for it while its load runs.
        The decisions are made one at a time, so two never count on the same bytes; the
        loads themselves run side by side, so a hung one holds only the room made for it
        (until --load-timeout-secs), never the other models' loads."""
        if not self.residency.budgeted:
            yield
            return
        async with self._budget:
            beside = name in self._serving()
            loading = Loading(name, await self._make_room(name), beside)
        self._loads.append(loading)
        try:
            yield
        finally:  # loaded, it counts as a resident from here: measured, not guessed
            self._loads.remove(loading)

    async def refresh(self) -> None:
        """Where the server manages memory, measure the loaded models again (for
        ``/stats`` and the index): at most once a second, and callers meanwhile share the
        measurement under way. Elsewhere footprints are as measured at load."""
        if not self.residency.tracking:
            return
        if self._measuring is None and time.monotonic() - self._measured_at >= 1.0:
            self._measuring = asyncio.ensure_future(self._measure())
            self._measuring.add_done_callback(self._measured)
        if self._measuring is not None:
            await asyncio.shield(self._measuring)

    def _measured(self, done: asyncio.Future) -> None:
        self._measuring = None
        self._measured_at = time.monotonic()
        if not done.cancelled():
            done.exception()  # retrieved: a failed measurement shows as the old numbers

    def resident_bytes(self) -> dict[str, Footprint]:
        """Each resident model's footprint as last measured (ensembles hold none)."""
        return {
            name: self.residency.footprints.get(name, Footprint())
            for name, versions in self._serving().items()
            if not any(v.pipeline for v in versions)
        }

    async def _make_room(self, name: str) -> Footprint:
        """Unload idle models, least recently used first, until ``name`` fits (by its
        footprint when it was loaded before, else its files' size in host memory: where
        it goes on a GPU is known once it is placed, and ``_trim`` sees it then). Each
        victim is chosen afresh, so one that took a request meanwhile stays."""
        residency = self.residency
        needed = residency.footprints.get(name) or Footprint(
            await asyncio.to_thread(folder_bytes, self._roots, name)
        )
        await self._measure()
        while True:
            residents = self._residents(exclude=name)
            over = residency.over(residents, needed)
            if over == Footprint():
                return needed
            victims = choose_victims(residents, over)
            if victims is None:
                message = refusal(name, needed, over, residency, residents)
                residency.reasons[name] = message
                raise RepositoryError(message, kind=ErrorKind.UNAVAILABLE)
            await self._evict(victims[0], name)

    async def _trim(self, loaded: str) -> None:
        """Measured after its load, ``loaded`` may take the total past a budget: the
        least recently used idle models holding memory there go until it fits. When busy
        ones hold the rest, it stays over for now (the next load trims again); when even
        they could not make it fit (pinned models hold it), ``loaded`` goes and its load
        fails, saying why, and nothing else is unloaded for it."""
        residency = self.residency
        await self._measure()
        while True:
            residents = self._residents(exclude=loaded)
            over = residency.over(residents, residency.footprints[loaded])
            if over == Footprint():
                return
            victims = choose_victims(residents, over)
            if victims is not None:
                await self._evict(victims[0], loaded)
                continue
            once_idle = [msgspec.structs.replace(r, busy=False) for r in residents]
            if choose_victims(once_idle, over) is None:
                message = refusal(loaded, residency.footprints[loaded], over, residency, residents)
                log.error("%s", message)
                await self._unload(loaded, False)
                residency.reasons[loaded] = message
                raise RepositoryError(message, kind=ErrorKind.UNAVAILABLE)
            idle = [r for r in residents if evictable(r) and helps(r, over)]
            if not idle:
                log.warning("%s: over a memory budget for now: busy models hold it", loaded)
                return
            await self._evict(min(idle, key=lambda r: r.last_used), loaded)

    async def _evict(self, victim: Resident, making_room_for: str) -> None:
        held = describe_footprint(victim.held)
        reason = f"evicted: least recently used, {held} for '{making_room_for}'"
        log.info("%s %s", victim.name, reason)
        # Said first: a load that brings it back meanwhile clears it, and the index is right.
        self.residency.evicted(victim.name, reason)
        # An ensemble goes with the steps no other loaded ensemble uses.
        await self._unload(victim.name, victim.ensemble)

    def _residents(self, exclude: str) -> list[Resident]:
        """The resident models, and the loads under way (by the room made for them, which
        no one may take) but another of ``exclude``. A model whose first load is under way
        counts by that room alone until it is measured, though it may serve already; a
        reload's old version counts as well, by its footprint."""
        first_loads = {load.name for load in self._loads if not load.beside}
        serving = {name: v for name, v in self._serving().items() if name not in first_loads}
        loads = [
            Resident(load.name, load.needed, 0.0, busy=False, pinned=False, protected="loading")
            for load in self._loads
            if load.name != exclude
        ]
        return residents_of(serving, self.residency, exclude) + loads

    async def _measure(self, serving: Serving | None = None) -> dict[str, Footprint]:
        """The footprints of ``serving`` (every resident model by default) now, measured
        off the event loop."""
        measured = await asyncio.to_thread(measure, serving or self._serving())
        self.residency.footprints.update(measured)
        return measured
