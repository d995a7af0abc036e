"""The JSON documents the check writes: a ``PhaseReport`` per phase, built from what a
``Phase`` collected while it ran, and the run's ``Summary``; latencies as they show."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np

from tools.gpu_check.node import Gpu

Status = Literal["passed", "failed", "skipped"]


class Check(msgspec.Struct):
    name: str
    ok: bool
    detail: str
    goal: bool = False  # a performance goal: reported, never fails the phase


class PhaseReport(msgspec.Struct):
    phase: str
    status: Status
    reason: str  # why it failed or was skipped; for a pass, the parts it skipped
    seconds: float
    headline: str  # the measured result in one line
    checks: list[Check]
    skipped_parts: dict[str, str]  # part -> why it did not run
    facts: dict[str, Any]
    error: str | None = None  # the traceback of an exception that stopped the phase
    server_logs: dict[str, str] = {}  # server label -> log tail, kept when the phase failed


class PhaseLine(msgspec.Struct):
    phase: str
    status: Status
    seconds: float
    line: str


class Summary(msgspec.Struct):
    ok: bool  # no phase failed
    seconds: float
    budget_s: float
    python: str
    torch: str | None
    cuda_available: bool
    gpus: list[Gpu]  # the GPUs this run could use, in CUDA's order
    no_gpu_reason: str
    phases: list[PhaseLine]


_encode = msgspec.json.Encoder().encode


def write(path: Path, document: PhaseReport | Summary) -> None:
    """``document`` as indented JSON."""
    path.write_bytes(msgspec.json.format(_encode(document)))


class Phase:
    """What one phase has found so far: its function fills it, ``report`` freezes it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.checks: list[Check] = []
        self.facts: dict[str, Any] = {}
        self.skipped_parts: dict[str, str] = {}
        self.skipped: str | None = None  # set when the phase's purpose could not run here
        self.headline = ""

    def check(self, name: str, ok: bool, detail: str = "", goal: bool = False) -> bool:
        self.checks.append(Check(name, bool(ok), detail, goal))
        return bool(ok)

    def skip_part(self, part: str, why: str) -> None:
        self.skipped_parts[part] = why

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        """Seconds ``step`` took, in the facts: where a phase spends the budget."""
        started = time.monotonic()
        try:
            yield
        finally:
            timings = self.facts.setdefault("timings_s", {})
            timings[step] = round(time.monotonic() - started, 2)

    def report(self, seconds: float, error: str | None, logs: dict[str, str]) -> PhaseReport:
        failed = [check for check in self.checks if not check.ok and not check.goal]
        if error is not None or failed:
            status: Status = "failed"
            reason = (
                error.strip().splitlines()[-1] if error else f"{failed[0].name}: {failed[0].detail}"
            )
        elif self.skipped is not None:
            status, reason = "skipped", self.skipped
        else:
            status = "passed"
            reason = "; ".join(f"{part} not run: {why}" for part, why in self.skipped_parts.items())
        return PhaseReport(
            self.name,
            status,
            reason,
            round(seconds, 1),
            self.headline,
            self.checks,
            self.skipped_parts,
            self.facts,
            error,
            logs if status == "failed" else {},
        )


def percentile_ms(latencies: list[float], q: float) -> float:
    """The ``q``th percentile of ``latencies`` (seconds) in ms, as the facts show it."""
    return round(float(np.percentile(np.array(latencies) * 1000, q)), 2) if latencies else 0.0
