"""Which models stay resident under the memory budgets (``--host-memory-budget``, and
``--gpu-memory-budget`` on each GPU alone).

Each loaded model's footprint (``footprints.py``) is measured once it is loaded and again
at each eviction decision. When a load would take the resident total past a budget, idle
models are unloaded, least recently used first, until it fits. A model is never evicted
while it has requests in progress, nor when ``[lifecycle] pinned = true``, nor while a
resident ensemble uses it (an ensemble's steps go with the ensemble, never under it). When
nothing can be freed, the load fails naming the budget and what holds it.

``Residency`` keeps the book (last use, requests in progress, footprints, why a model is
not resident); ``choose_victims`` is the decision, a pure function of that book.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import msgspec

from reposerve.arguments import Budget
from reposerve.metrics import CustomFamily, CustomMetric
from reposerve.repository.footprints import Footprint, host_memory_total

GIB = 1 << 30


def refusal(
    name: str,
    needed: Footprint,
    over: Footprint,
    residency: Residency,
    residents: Sequence[Resident],
) -> str:
    """Why ``name`` cannot load: the budget it is ``over``, and what holds it that cannot go."""
    device = None if over.host > 0 else min(over.gpu)
    if device is None:
        budget, limit, what = residency.host_budget, residency.host_limit, "host memory budget"
        flag = "--host-memory-budget"
    else:
        budget, limit = residency.gpu_budget, residency.gpu_limits[device]
        what, flag = f"memory budget of GPU {device}", "--gpu-memory-budget"

    def held_there(resident: Resident) -> int:
        return resident.held.host if device is None else resident.held.gpu.get(device, 0)

    holders = [
        f"'{r.name}' {describe_bytes(held_there(r))} ({_why_kept(r)})"
        for r in sorted(residents, key=lambda r: -held_there(r))
        if held_there(r)
    ]
    listed = f"; held by {', '.join(holders)}" if holders else ""
    takes = needed.host if device is None else needed.gpu.get(device, 0)
    return (
        f"load '{name}': it takes about {describe_bytes(takes)}, which does not fit the {what} "
        f"{budget.text if budget else ''} ({describe_bytes(limit or 0)}){listed}. Hint: raise "
        f"{flag}, or unpin or unload a model"
    )


def _why_kept(resident: Resident) -> str:
    if resident.pinned:
        return "pinned"
    if resident.busy:
        return "busy"
    return resident.protected or "idle"


def describe_footprint(footprint: Footprint) -> str:
    """``84 MiB``, or with GPU memory ``84 MiB, 2.1 GiB on GPU 0``."""
    on_gpus = [f"{describe_bytes(n)} on GPU {d}" for d, n in sorted(footprint.gpu.items()) if n]
    return ", ".join([describe_bytes(footprint.host), *on_gpus])


def describe_bytes(nbytes: int) -> str:
    if nbytes >= GIB:
        return f"{nbytes / GIB:.1f} GiB"
    return f"{nbytes / (1 << 20):.0f} MiB"


class Resident(msgspec.Struct, frozen=True):
    """A resident model as eviction sees it (an ensemble: with the steps only it uses)."""

    name: str
    held: Footprint
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
        # Steps not resident (one an eviction took, loading again) hold nothing here: a
        # load under way counts by its own room, and a stale footprint would count twice.
        steps = [s for s, used in users.items() if used == [name] and s in serving]
        members = [name, *steps] if ensemble else [name]
        residents.append(
            Resident(
                name,
                sum((residency.footprints.get(m, Footprint()) for m in members), Footprint()),
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


def _busy(versions: list[Any]) -> bool:
    """Whether a version has work its scheduler holds: requests queued or running, or
    (a stateful model) sequences open, whose state an eviction would lose."""
    return any(v.scheduler.busy for v in versions)


def helps(resident: Resident, over: Footprint) -> bool:
    """Whether unloading ``resident`` frees memory where a budget is ``over``."""
    held = resident.held
    return (over.host > 0 and held.host > 0) or any(
        held.gpu.get(device, 0) for device, n in over.gpu.items() if n > 0
    )


def evictable(resident: Resident) -> bool:
    return not (resident.busy or resident.pinned or resident.protected)


def choose_victims(residents: Iterable[Resident], over: Footprint) -> list[Resident] | None:
    """The idle, unpinned, unprotected models to unload, least recently used first, until
    what is ``over`` each budget (host, each GPU) is freed; a model holding nothing where
    a budget is still over is passed by. None when all of them together do not free
    enough."""
    victims: list[Resident] = []
    for resident in sorted(residents, key=lambda r: r.last_used):
        if over == Footprint():
            break
        if not evictable(resident) or not helps(resident, over):
            continue
        victims.append(resident)
        held = resident.held
        over = Footprint(
            max(over.host - held.host, 0),
            {
                device: n - held.gpu.get(device, 0)
                for device, n in over.gpu.items()
                if n - held.gpu.get(device, 0) > 0
            },
        )
    return victims if over == Footprint() else None


class Residency:
    """The book: when each model was last used, its requests in progress, its measured
    footprint, and why a model that is not resident is not."""

    def __init__(
        self,
        host_budget: Budget | None = None,
        on_demand: bool = False,
        clock: Callable[[], float] = time.monotonic,
        gpu_budget: Budget | None = None,
        gpu_memory: Sequence[int] = (),
    ) -> None:
        """``gpu_memory``: each visible GPU's memory in bytes, for ``gpu_budget``'s share
        (the budget holds on each GPU alone)."""
        self.host_budget = host_budget
        self.host_limit = host_budget.of(host_memory_total()) if host_budget else None
        self.gpu_budget = gpu_budget
        self.gpu_limits = (
            {device: gpu_budget.of(total) for device, total in enumerate(gpu_memory)}
            if gpu_budget
            else {}
        )
        # Whether loads are counted and requests tracked at all (models come and go on
        # their own): a server without a budget or on-demand loading pays nothing for it.
        self.tracking = on_demand or self.budgeted
        self.on_demand = on_demand
        self._clock = clock
        self.last_used: dict[str, float] = {}
        self.active: dict[str, int] = {}
        self.footprints: dict[str, Footprint] = {}  # as last measured
        self.reasons: dict[str, str] = {}  # name -> why not resident (evicted: ...)
        self.loads = 0
        self.evictions = 0
        self._load_buckets = [0] * len(LOAD_BUCKETS)  # per bucket, not cumulative
        self._load_seconds = 0.0

    @property
    def budgeted(self) -> bool:
        return self.host_limit is not None or bool(self.gpu_limits)

    def over(self, residents: Sequence[Resident], incoming: Footprint) -> Footprint:
        """How far ``residents`` and ``incoming`` together are over each budget (0 where
        within it)."""
        total = sum((r.held for r in residents), incoming)
        host = total.host - self.host_limit if self.host_limit is not None else 0
        gpu = {
            device: total.gpu.get(device, 0) - limit for device, limit in self.gpu_limits.items()
        }
        return Footprint(max(host, 0), {device: n for device, n in gpu.items() if n > 0})

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
            return
        self.active.pop(name, None)
        if name not in self.footprints:
            # Never loaded (a made-up name, or a model whose load failed): it keeps
            # nothing past its requests, or every name a client invents stays forever.
            self.last_used.pop(name, None)

    @contextlib.contextmanager
    def in_use(self, names: Iterable[str]) -> Iterator[None]:
        """``names`` are in use (never evicted) for the ``with`` block, as if a request
        for each were in progress: a model a load needs stays until that load is done."""
        held = list(names)
        for name in held:
            self.begin(name)
        try:
            yield
        finally:
            for name in held:
                self.end(name)

    def busy(self, name: str) -> bool:
        return name in self.active

    def loaded(self, name: str, footprint: Footprint, seconds: float) -> None:
        self.footprints[name] = footprint
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

    def families(self, resident: dict[str, Footprint]) -> list[CustomFamily]:
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
                [CustomMetric((("model", name),), held.host) for name, held in resident.items()],
            ),
            CustomFamily(
                "reposerve_model_resident_gpu_bytes",
                "GPU memory a resident model's instances hold, per GPU (NVML)",
                "gauge",
                [
                    CustomMetric((("model", name), ("gpu", str(device))), nbytes)
                    for name, held in resident.items()
                    for device, nbytes in sorted(held.gpu.items())
                ],
            ),
        ]


LOAD_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
