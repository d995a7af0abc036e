"""Which models stay resident under a memory budget (``--host-memory-budget``), and what
each one costs.

Each loaded model's footprint is measured once it is loaded: the proportional set size
(PSS) of its instance processes, so pages they share (libraries, the interpreter) are
counted once across them. When a
load would take the resident total past a budget, idle models are unloaded, least recently
used first, until it fits. A model is never evicted while it has requests in progress, nor
when ``[lifecycle] pinned = true``, nor while a resident ensemble uses it (an ensemble's
steps go with the ensemble, never under it). When nothing can be freed, the load fails
naming the budget and what holds it.

``Residency`` keeps the book (last use, requests in progress, footprints, why a model is
not resident); ``choose_victims`` is the decision, a pure function of that book.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from reposerve.arguments import Budget
from reposerve.metrics import CustomFamily, CustomMetric

GIB = 1 << 30


def host_memory_total() -> int:
    """The machine's memory, or the container's limit when it sets a lower one (a share
    of more than the container may hold would end in the OOM killer)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def pss_bytes(pid: int) -> int:
    """The proportional set size of ``pid`` (0 when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def footprint(version: Any) -> int:
    """A loaded version's host footprint: its instance processes' PSS."""
    return sum(pss_bytes(instance.pid) for instance in version.instances if instance.pid)


def folder_bytes(roots: Sequence[Path], name: str) -> int:
    """What a model never loaded before is expected to take: its files' size (its weights,
    mostly); 0 when the folder cannot be read (its load will say why)."""
    for root in roots:
        folder = root / name
        if folder.is_dir():
            return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    return 0


def refusal(name: str, needed: int, residency: Residency, residents: Sequence[Resident]) -> str:
    """Why ``name`` cannot load: the budget, and what holds it that cannot go."""
    budget = residency.host_budget
    held = [
        f"'{r.name}' {describe_bytes(r.nbytes)} ({_why_kept(r)})"
        for r in sorted(residents, key=lambda r: -r.nbytes)
    ]
    holders = f"; held by {', '.join(held)}" if held else ""
    limit = describe_bytes(residency.host_limit or 0)
    return (
        f"load '{name}': it takes about {describe_bytes(needed)}, which does not fit the host "
        f"memory budget {budget.text if budget else ''} ({limit}){holders}. Hint: raise "
        "--host-memory-budget, or unpin or unload a model"
    )


def _why_kept(resident: Resident) -> str:
    if resident.pinned:
        return "pinned"
    if resident.busy:
        return "busy"
    return resident.protected or "idle"


def describe_bytes(nbytes: int) -> str:
    if nbytes >= GIB:
        return f"{nbytes / GIB:.1f} GiB"
    return f"{nbytes / (1 << 20):.0f} MiB"


class Resident(msgspec.Struct, frozen=True):
    """A resident model as eviction sees it (an ensemble: with the steps only it uses)."""

    name: str
    nbytes: int
    last_used: float
    busy: bool  # requests queued or running, or sequences open
    pinned: bool
    protected: str | None = None  # why it may not go alone (a resident ensemble uses it)
    ensemble: bool = False


def residents_of(
    serving: dict[str, list[Any]], residency: Residency, exclude: str
) -> list[Resident]:
    """The resident models as eviction sees them, ``serving`` (name -> its READY
    versions), by their footprints as last measured (``measure``). A step of a resident
    ensemble is protected: it goes with the ensemble (as part of its unit, when no other
    ensemble uses it), never under it."""
    users: dict[str, list[str]] = {}
    for name, versions in serving.items():
        for step in {step.model for v in versions for step in v.config.step}:
            users.setdefault(step, []).append(name)
    # a step only one ensemble uses is part of that ensemble's unit, not a resident alone
    in_units = {step for step, used in users.items() if len(used) == 1 and used[0] != exclude}
    residents = []
    for name, versions in serving.items():
        if name == exclude or name in in_units:
            continue
        ensemble = any(v.pipeline for v in versions)
        steps = [s for s, used in users.items() if used == [name]] if ensemble else []
        members = [name, *steps]
        residents.append(
            Resident(
                name,
                sum(residency.footprints.get(member, 0) for member in members),
                residency.last_used.get(name, 0.0),
                busy=any(
                    residency.busy(member) or _busy(serving.get(member, [])) for member in members
                ),
                pinned=any(v.config.lifecycle.pinned for v in versions),
                protected=(
                    f"a step of the resident ensemble '{users[name][0]}'" if name in users else None
                ),
                ensemble=ensemble,
            )
        )
    return residents


def measure(serving: dict[str, list[Any]]) -> dict[str, int]:
    """Each model's footprint now (PSS moves as shared pages lose their other users and
    arenas grow): a walk of each instance's page tables, so run it off the event loop."""
    return {
        name: sum(footprint(v) for v in versions)
        for name, versions in serving.items()
        if not any(v.pipeline for v in versions)
    }


def _busy(versions: list[Any]) -> bool:
    """Whether a version has work its scheduler holds: requests queued or running, or
    (a stateful model) sequences open, whose state an eviction would lose."""
    return any(v.scheduler.busy for v in versions)


def choose_victims(residents: Iterable[Resident], needed: int) -> list[Resident] | None:
    """The idle, unpinned, unprotected models to unload, least recently used first, until
    ``needed`` bytes are freed; None when all of them together do not free enough."""
    victims: list[Resident] = []
    freed = 0
    for resident in sorted(residents, key=lambda r: r.last_used):
        if freed >= needed:
            break
        if resident.busy or resident.pinned or resident.protected:
            continue
        victims.append(resident)
        freed += resident.nbytes
    return victims if freed >= needed else None


class Residency:
    """The book: when each model was last used, its requests in progress, its measured
    footprint, and why a model that is not resident is not."""

    def __init__(
        self,
        host_budget: Budget | None = None,
        on_demand: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host_budget = host_budget
        self.host_limit = host_budget.of(host_memory_total()) if host_budget else None
        # Whether loads are counted and requests tracked at all (models come and go on
        # their own): a server without a budget or on-demand loading pays nothing for it.
        self.tracking = on_demand or host_budget is not None
        self._clock = clock
        self.last_used: dict[str, float] = {}
        self.active: dict[str, int] = {}
        self.footprints: dict[str, int] = {}  # host bytes, as last measured
        self.reasons: dict[str, str] = {}  # name -> why not resident (evicted: ...)
        self.loads = 0
        self.evictions = 0
        self._load_buckets = [0] * len(LOAD_BUCKETS)  # per bucket, not cumulative
        self._load_seconds = 0.0

    @property
    def budgeted(self) -> bool:
        return self.host_limit is not None

    def begin(self, name: str) -> None:
        """A request for ``name`` is in progress: it is used, and busy until ``end``."""
        if not self.tracking:
            return
        self.last_used[name] = self._clock()
        self.active[name] = self.active.get(name, 0) + 1

    def end(self, name: str) -> None:
        if not self.tracking:
            return
        left = self.active.get(name, 0) - 1
        if left > 0:
            self.active[name] = left
        else:
            self.active.pop(name, None)

    def busy(self, name: str) -> bool:
        return name in self.active

    def loaded(self, name: str, nbytes: int, seconds: float) -> None:
        self.footprints[name] = nbytes
        self.reasons.pop(name, None)
        self.last_used[name] = self._clock()  # just loaded: not the next to go
        self.loads += 1
        self._load_seconds += seconds
        for index, bound in enumerate(LOAD_BUCKETS):
            if seconds <= bound:
                self._load_buckets[index] += 1
                break

    def evicted(self, name: str, reason: str) -> None:
        self.reasons[name] = reason
        self.evictions += 1

    def families(self, resident: dict[str, int]) -> list[CustomFamily]:
        """Loads, evictions, load times and ``resident`` bytes per model, for /metrics."""
        return [
            CustomFamily(
                "reposerve_model_loads_total",
                "Model loads (on demand, or asked for)",
                "counter",
                [CustomMetric((), self.loads)],
            ),
            CustomFamily(
                "reposerve_model_evictions_total",
                "Models unloaded to keep within a memory budget",
                "counter",
                [CustomMetric((), self.evictions)],
            ),
            CustomFamily(
                "reposerve_model_load_duration_seconds",
                "Time to load a model, its instances started and warmed up",
                "histogram",
                [
                    CustomMetric(
                        (),
                        self._load_seconds,
                        LOAD_BUCKETS,
                        tuple(self._load_buckets),
                        self.loads,
                    )
                ],
            ),
            CustomFamily(
                "reposerve_model_resident_bytes",
                "Host memory a resident model's instances hold (PSS)",
                "gauge",
                [CustomMetric((("model", name),), nbytes) for name, nbytes in resident.items()],
            ),
        ]


LOAD_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
