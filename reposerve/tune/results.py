"""What ``reposerve tune`` measured, as written to ``results.json``."""

from __future__ import annotations

from typing import Literal

import msgspec

from reposerve.tune.space import Machine, Value

# model -> knob -> value: a candidate configuration, as the knobs see it.
Settings = dict[str, dict[str, Value]]
Status = Literal["measured", "failed", "rejected"]


class Point(msgspec.Struct, frozen=True):
    """One concurrency of a sweep."""

    concurrency: int
    throughput: float  # answered requests/s
    p50_ms: float
    p99_ms: float
    errors: int = 0


class Trial(msgspec.Struct, kw_only=True):
    """One candidate: its settings, its sweep and its score."""

    label: str  # what it changed from the candidate it was tried against
    settings: Settings
    points: list[Point] = []
    score: float = 0.0  # requests/s at the best concurrency within the p99 budget
    concurrency: int = 0  # that concurrency
    status: Status = "measured"
    reason: str = ""  # why failed or rejected, or what limited it
    seconds: float = 0.0  # what trying it cost, load and sweep
    output_error: float | None = None  # precision: largest difference from fp32 outputs


class ABRound(msgspec.Struct, frozen=True):
    current: Point
    tuned: Point


class ABResult(msgspec.Struct, frozen=True):
    """The tuned candidate against the current configuration, in interleaved rounds."""

    rounds: list[ABRound]
    ratio: float  # median over rounds of tuned/current throughput
    tuned_wins: bool
    verdict: str


class TuneResults(msgspec.Struct, kw_only=True):
    model: str
    machine: Machine
    p99_budget_ms: float | None
    time_budget_s: float
    seconds: float
    baseline: Trial
    trials: list[Trial]
    best: Trial
    ab: ABResult | None
    recommended: Settings  # the baseline's when the current configuration stays best
    left_out: list[str]  # knobs and values not tried, with why
    configs: dict[str, str]  # model -> recommended config.toml text
