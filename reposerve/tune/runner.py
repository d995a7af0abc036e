"""The measuring side of ``reposerve tune``: a candidate's settings become configurations,
loaded on the server with a config override (no restart), checked against fp32 outputs
when they change the precision, and swept over concurrency with the load generator."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence

import msgspec
import numpy as np

from reposerve.config.schema import ModelConfig
from reposerve.config.triton import to_triton
from reposerve.config.triton_json import parse_triton_config
from reposerve.errors import ConfigError, TuneError
from reposerve.tune.client import ServerClient
from reposerve.tune.load import closed_loop
from reposerve.tune.requests import SampleRequest
from reposerve.tune.results import Point, Settings, Trial
from reposerve.tune.search import score
from reposerve.tune.space import Knob, Machine, knobs_for

MAX_CONCURRENCY = 256
SATURATED = 1.05  # a doubling of concurrency that adds less throughput ends the sweep
CHECKED_REQUESTS = 4  # sample requests whose outputs are compared with fp32's


class Sweep(msgspec.Struct, frozen=True):
    """How each candidate is measured."""

    concurrencies: tuple[int, ...] | None  # None: auto, doubling until it saturates
    point_seconds: float
    warmup_seconds: float
    p99_budget_ms: float | None
    tolerance: float  # the largest output difference from fp32 accepted, relative


class Target(msgspec.Struct, frozen=True):
    """One model whose configuration is tuned (the model itself, or an ensemble's step)."""

    name: str
    backend: str
    config: ModelConfig  # as it was served when tune started
    # The batches it must still take: an ensemble passes its own on to its steps.
    smallest_batch: int = 1


def targets_of(client: ServerClient, model: str, smallest_batch: int = 1) -> list[Target]:
    """The models to configure for ``model``: itself, or an ensemble's steps (nested ones
    included), each as the server serves it now."""
    config = _served(client, model)
    if config.backend != "ensemble":
        assert config.backend is not None  # a served config names its backend
        return [Target(model, config.backend, config, smallest_batch)]
    found: dict[str, Target] = {}
    for step in config.step:
        for target in targets_of(client, step.model, max(smallest_batch, config.max_batch_size)):
            known = found.get(target.name)
            if known is None or known.smallest_batch < target.smallest_batch:
                found[target.name] = target
    return list(found.values())


def _served(client: ServerClient, model: str) -> ModelConfig:
    document = client.config(model)
    try:
        text = msgspec.json.encode(document).decode()
        return parse_triton_config(text, f"{model} (served config)")
    except ConfigError as exc:
        raise TuneError(f"cannot read {model}'s config from the server: {exc.message}") from None


class Runner:
    def __init__(
        self,
        client: ServerClient,
        model: str,
        targets: Sequence[Target],
        requests: Sequence[SampleRequest],
        sweep: Sweep,
        machine: Machine,
        progress: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.client = client
        self.model = model
        self.targets = {target.name: target for target in targets}
        self.requests = list(requests)
        self.sweep = sweep
        self._progress = progress
        self._payloads = [request.payload(client.host, model) for request in self.requests]
        smallest = max(request.batch for request in self.requests)
        self.knobs: dict[str, list[Knob]] = {}
        self.left_out: list[str] = []
        for target in targets:
            floor = max(smallest, target.smallest_batch)
            knobs, left_out = knobs_for(target.config, target.backend, machine, floor)
            self.knobs[target.name] = knobs
            prefix = f"{target.name}: " if len(targets) > 1 else ""
            self.left_out += [prefix + line for line in left_out]
        self.baseline = {
            name: {knob.name: knob.read(self.targets[name].config) for knob in knobs}
            for name, knobs in self.knobs.items()
        }
        self._loaded = self.baseline
        self._reference: dict[str, np.ndarray] | None = None
        self._best = (0.0, 1)  # the best score measured so far, and its concurrency
        self.load_seconds = 0.0  # the longest load so far
        # The longest a point took past its window (connecting, the last answers drained)
        self.point_overrun = 0.0

    def busy_ns(self) -> dict[str, int]:
        """Each model's time spent executing batches so far, per instance (statistics)."""
        busy = {}
        for name, target in self.targets.items():
            stats = self.client.get(f"/v2/models/{name}/stats")["model_stats"]
            total = sum(b["compute_infer"]["ns"] for s in stats for b in s["batch_stats"])
            instances = sum(group.count for group in target.config.instance_group or ())
            busy[name] = total // max(instances, 1)
        return busy

    def plan(self, busy_ns: dict[str, int] | None = None) -> list[tuple[str, Knob]]:
        """Every (model, knob) in search order: the busiest model's knobs first (in an
        ensemble, the step that limits it), each model's in the order knobs_for gives."""
        names = sorted(self.knobs, key=lambda name: -(busy_ns or {}).get(name, 0))
        return [(name, knob) for name in names for knob in self.knobs[name]]

    def configure(self, settings: Settings) -> dict[str, ModelConfig]:
        configs = {}
        for name, target in self.targets.items():
            config = target.config
            for knob in self.knobs[name]:
                value = settings[name][knob.name]
                # a knob the others turned off (queue delay without batching) waits
                if knob.unusable(config) is None and value != knob.read(config):
                    config = knob.write(config, value)
            configs[name] = config
        return configs

    def evaluate(self, settings: Settings, label: str) -> Trial:
        """Load ``settings``, check its outputs if its precision changed, sweep it."""
        trial = Trial(label=label, settings=settings)
        try:
            if self._changes_outputs(settings):
                trial.output_error = self._output_error(settings)
                if not trial.output_error <= self.sweep.tolerance:  # NaN too
                    trial.status = "rejected"
                    trial.reason = (
                        f"outputs differ from fp32's by {trial.output_error:.2g} (relative; "
                        f"tolerance {self.sweep.tolerance:g})"
                    )
                    return trial
            self.apply(settings)
            trial.points = self._sweep(label, self._capacity(settings))
        except TuneError as exc:
            trial.status, trial.reason = "failed", exc.message
            return trial
        except OSError as exc:  # the load generator lost the server
            trial.status, trial.reason = "failed", f"the server stopped answering: {exc}"
            return trial
        failed = [point for point in trial.points if point.errors]
        if failed:
            trial.status = "failed"
            trial.reason = f"{failed[0].errors} requests failed at c={failed[0].concurrency}"
            trial.reason += f": {self._one_error()}"
            return trial
        trial.score, trial.concurrency = score(trial.points, self.sweep.p99_budget_ms)
        self._best = max(self._best, (trial.score, trial.concurrency))
        if trial.score == 0.0 and all(math.isinf(point.p99_ms) for point in trial.points):
            trial.reason = f"no request was answered within {self.sweep.point_seconds:g} s"
        elif trial.score == 0.0:
            trial.reason = f"p99 above {self.sweep.p99_budget_ms:g} ms at every concurrency tried"
        return trial

    def measure(self, settings: Settings, concurrency: int) -> Point:
        """One point of ``settings`` at ``concurrency`` (the A/B's rounds)."""
        self.apply(settings)
        return self._point(concurrency, self.sweep.warmup_seconds)

    def apply(self, settings: Settings) -> None:
        """Load every model whose settings differ from what the server runs now."""
        configs = self.configure(settings)
        for name, values in settings.items():
            if values == self._loaded.get(name):
                continue
            self._loaded = {**self._loaded, name: {}}  # unknown until the load answers
            document = to_triton(name, self.targets[name].backend, configs[name])
            started = time.monotonic()
            self.client.load(name, document)
            self.load_seconds = max(self.load_seconds, time.monotonic() - started)
            self._loaded = {**self._loaded, name: values}

    def restore(self) -> list[str]:
        """Reload from its folder every model tune changed on the server; what could not
        be, with why (each model is tried whatever happened to the others)."""
        problems = []
        for name, values in self._loaded.items():
            if values != self.baseline[name]:
                try:
                    self.client.load(name)
                except TuneError as exc:
                    problems.append(f"{name} could not be reloaded from its folder: {exc.message}")
        self._loaded = self.baseline
        return problems

    def _capacity(self, settings: Settings) -> int:
        """The requests the candidate holds at once: each instance runs one batch and has
        the next staged. Below it, more clients always have more to batch (a dynamic
        batcher fills a batch only from what is queued)."""
        most = 1
        for config in self.configure(settings).values():
            batch = config.max_batch_size if config.dynamic_batching is not None else 1
            groups = config.instance_group or ()
            most = max(most, 2 * max(batch, 1) * max(sum(g.count for g in groups), 1))
        return most

    def _sweep(self, label: str, capacity: int) -> list[Point]:
        """Points of rising concurrency until it saturates: past ``capacity``, a
        doubling that adds less than 5%. Once a candidate has been measured, sweeps start
        a quarter of the way to its best concurrency: below, nothing is decided."""
        points: list[Point] = []
        start = max(1, self._best[1] // 4)
        ladder = self.sweep.concurrencies or [c for c in _doublings() if c >= start]
        best = 0.0
        budget = self.sweep.p99_budget_ms
        for index, concurrency in enumerate(ladder):
            warmup = self.sweep.warmup_seconds * (2 if index == 0 else 1)  # a load's first runs
            point = self._point(concurrency, warmup)
            points.append(point)
            self._progress(f"{label}: c={concurrency} {point.throughput:.0f}/s")
            over = math.isinf(point.p99_ms) or (budget is not None and point.p99_ms > budget)
            if index == 0 and over and not point.errors and self.sweep.concurrencies is None:
                return self._below(label, concurrency, points)
            if point.errors or over:
                break
            saturated = concurrency >= capacity and point.throughput < best * SATURATED
            if self.sweep.concurrencies is None and saturated:
                break
            best = max(best, point.throughput)
        return points

    def _below(self, label: str, concurrency: int, points: list[Point]) -> list[Point]:
        """Halve the concurrency from a first point over the budget until one keeps it:
        a sweep started high must not score a candidate 0 unmeasured below."""
        budget = self.sweep.p99_budget_ms
        while concurrency > 1:
            concurrency //= 2
            point = self._point(concurrency, self.sweep.warmup_seconds)
            points.insert(0, point)
            self._progress(f"{label}: c={concurrency} {point.throughput:.0f}/s")
            if point.errors or score([point], budget)[0] > 0:
                break
        return points

    def _point(self, concurrency: int, warmup: float) -> Point:
        started = time.monotonic()
        run = asyncio.run(
            closed_loop(
                "tune",
                self.client.host,
                self.client.port,
                self._payloads,
                concurrency,
                self.sweep.point_seconds,
                warmup,
            )
        )
        window = self.sweep.point_seconds + warmup
        self.point_overrun = max(self.point_overrun, time.monotonic() - started - window)
        # Little's law: each of the clients always has one request out, so they are answered
        # at concurrency / mean latency. Counting answers in the window instead moves in steps
        # of a whole batch per window, 20% or more for a slow model's few big batches.
        if not run.completed:  # nothing answered within the window: no latency to show
            return Point(concurrency, 0.0, math.inf, math.inf, run.errors)
        throughput = concurrency * 1000 / run.mean_ms
        return Point(concurrency, throughput, run.p50_ms, run.p99_ms, run.errors)

    def _one_error(self) -> str:
        try:
            self.client.infer(self.model, self.requests[0])
        except TuneError as exc:
            return exc.message
        return "the error did not repeat"

    def _changes_outputs(self, settings: Settings) -> bool:
        """Whether ``settings`` moves a precision away from the baseline's, to one other
        than fp32 (the baseline is what it is: never rejected)."""
        return any(
            settings[name][knob.name] not in (knob.ladder[0], self.baseline[name][knob.name])
            for name, knobs in self.knobs.items()
            for knob in knobs
            if knob.checked
        )

    def _output_error(self, settings: Settings) -> float:
        """The largest difference between ``settings``' outputs and the same configuration
        at fp32, relative to the fp32 output's largest magnitude."""
        if self._reference is None:
            exact = {
                name: {
                    knob.name: knob.ladder[0] if knob.checked else settings[name][knob.name]
                    for knob in knobs
                }
                for name, knobs in self.knobs.items()
            }
            self.apply(exact)
            self._reference = self._outputs()
        self.apply(settings)
        outputs = self._outputs()
        return max(_difference(self._reference[key], outputs[key]) for key in self._reference)

    def _outputs(self) -> dict[str, np.ndarray]:
        outputs = {}
        for index, request in enumerate(self.requests[:CHECKED_REQUESTS]):
            for name, value in self.client.infer(self.model, request).items():
                outputs[f"{index}/{name}"] = value
        return outputs


def _difference(reference: np.ndarray, other: np.ndarray) -> float:
    if reference.dtype == object or other.dtype == object:
        return 0.0 if np.array_equal(reference, other) else 1.0
    if reference.shape != other.shape:
        return float("inf")
    expected = reference.astype(np.float64)
    scale = max(float(np.abs(expected).max(initial=0.0)), 1e-12)
    return float(np.abs(other.astype(np.float64) - expected).max(initial=0.0)) / scale


def _doublings() -> tuple[int, ...]:
    ladder = [1]
    while ladder[-1] * 2 <= MAX_CONCURRENCY:
        ladder.append(ladder[-1] * 2)
    return tuple(ladder)
