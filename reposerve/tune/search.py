"""The search: coordinate descent over the knobs, coarse then fine, within a time budget.

Each knob is walked from its current value up its ladder while a step pays (beats the
best so far by ``PAYS``), and down only when the first step up did not; one value between
the best and its better neighbour is tried last. The best candidate then carries into the
next knob, so knobs that interact (batch size, then the instances that fill it) are tried
on top of each other, never as a blind grid. A trial is not started when its expected cost
would eat into the reserve kept for the final A/B; what was not tried is listed.

Nothing here measures: ``evaluate`` does, so this logic is tested with a known function
and a fake clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence

import msgspec

from reposerve.config.schema import ModelConfig
from reposerve.tune.results import ABResult, ABRound, Point, Settings, Trial
from reposerve.tune.space import Knob, Value

PAYS = 1.05  # a change must beat the best by 5%: less is within this machine's noise
AB_ROUNDS = 3

Evaluate = Callable[[Settings, str], Trial]
Configure = Callable[[Settings], Mapping[str, ModelConfig]]


def changed(settings: Settings, model: str, knob: Knob, value: Value) -> Settings:
    copy = {name: dict(values) for name, values in settings.items()}
    copy[model][knob.name] = value
    return copy


class Search:
    def __init__(
        self,
        evaluate: Evaluate,
        configure: Configure,
        clock: Callable[[], float],
        deadline: Callable[[], float],
        models: int = 1,
        first_estimate: float = 0.0,
    ) -> None:
        """``deadline()``: the clock's time by which every trial must have ended (it may
        move as trials tell what the rest of the run will cost)."""
        self._evaluate = evaluate
        self._configure = configure
        self._clock = clock
        self._deadline = deadline
        self._several = models > 1
        self._first_estimate = first_estimate  # what a trial costs before one has run
        self.trials: list[Trial] = []
        self.left_out: list[str] = []
        self._seen: dict[bytes, Trial] = {}
        self._out_of_time = False

    def run(self, baseline: Trial, plan: Sequence[tuple[str, Knob]]) -> Trial:
        """The best trial found from ``baseline`` turning each (model, knob) in turn."""
        self._seen[_key(baseline.settings)] = baseline
        self._baseline = baseline.settings
        self._knobs = {(model, knob.name): knob for model, knob in plan}
        best = baseline
        for model, knob in plan:
            if self._out_of_time:
                self.left_out.append(f"{self._name(model, knob.name)}: not tried (time budget)")
                continue
            best = self._turn(best, model, knob)
        return best

    def _turn(self, best: Trial, model: str, knob: Knob) -> Trial:
        config = self._configure(best.settings)[model]
        reason = knob.unusable(config)
        if reason is not None:
            self.left_out.append(f"{self._name(model, knob.name)}: {reason}")
            return best
        current = knob.read(config)
        ladder = list(knob.ladder)
        if current not in ladder:
            ladder.append(current)
            if knob.numeric:
                ladder.sort()
        if not knob.numeric:
            for value in ladder:
                trial = self._try(best, model, knob, value)
                if trial is not None and _better(trial, best):
                    best = trial
            return best
        start = ladder.index(current)
        for step in (1, -1):
            moved = False
            index = start + step
            while 0 <= index < len(ladder):
                trial = self._try(best, model, knob, ladder[index])
                if trial is None or not _better(trial, best):
                    break
                best, moved = trial, True
                index += step
            if moved:
                break
        return self._refine(best, model, knob, ladder)

    def _refine(self, best: Trial, model: str, knob: Knob, ladder: list[Value]) -> Trial:
        """One value halfway between the best and its better measured neighbour."""
        value = best.settings[model][knob.name]
        index = ladder.index(value)
        neighbours = [
            (trial.score, ladder[i])
            for i in (index - 1, index + 1)
            if 0 <= i < len(ladder)
            and (trial := self._seen.get(_key(changed(best.settings, model, knob, ladder[i]))))
        ]
        floor = knob.refine_from
        if not neighbours or not isinstance(value, int) or value < floor:
            return best
        _, neighbour = max(neighbours, key=lambda pair: pair[0])
        if not isinstance(neighbour, int) or neighbour < floor or abs(neighbour - value) < 2:
            return best
        trial = self._try(best, model, knob, (value + neighbour) // 2)
        return trial if trial is not None and _better(trial, best) else best

    def _try(self, best: Trial, model: str, knob: Knob, value: Value) -> Trial | None:
        """The trial of ``best`` with ``knob`` at ``value``; None when out of time."""
        settings = changed(best.settings, model, knob, value)
        key = _key(settings)
        if key in self._seen:
            return self._seen[key]
        label = self._label(settings)
        if self._out_of_time or self._clock() + self._expected() > self._deadline():
            self._out_of_time = True
            self.left_out.append(f"{label}: not tried (time budget)")
            return None
        started = self._clock()
        trial = self._evaluate(settings, label)
        trial.seconds = self._clock() - started
        self._seen[key] = trial
        self.trials.append(trial)
        return trial

    def _expected(self) -> float:
        """What the next trial may cost: the longest so far (a trial whose sweep reaches
        one more concurrency costs a point more than the median, and the budget is firm)."""
        return max((t.seconds for t in self.trials), default=self._first_estimate)

    def _label(self, settings: Settings) -> str:
        """What ``settings`` changes from the baseline, model by model."""
        parts = []
        for model, values in settings.items():
            changes = ", ".join(
                self._knobs[model, name].describe(value)
                for name, value in values.items()
                if value != self._baseline[model][name] and (model, name) in self._knobs
            )
            if changes:
                parts.append(self._name(model, changes))
        return "; ".join(parts)

    def _name(self, model: str, text: str) -> str:
        return f"{model}: {text}" if self._several else text


def _better(trial: Trial, best: Trial) -> bool:
    return trial.status == "measured" and trial.score > best.score * PAYS


def _key(settings: Settings) -> bytes:
    return msgspec.json.encode(settings, order="sorted")


def score(points: Sequence[Point], p99_budget_ms: float | None) -> tuple[float, int]:
    """The best throughput (and its concurrency) among the error-free points within the
    p99 budget; (0, 0) when there is none."""
    within = [point for point in points if _within(point, p99_budget_ms)]
    if not within:
        return 0.0, 0
    best = max(within, key=lambda point: point.throughput)
    return best.throughput, best.concurrency


def ab_test(
    current: Trial,
    tuned: Trial,
    measure: Callable[[Settings, int], Point],
    p99_budget_ms: float | None,
    rounds: int = AB_ROUNDS,
    time_left: Callable[[], float] = lambda: math.inf,
) -> ABResult:
    """Current and tuned measured in turn, ``rounds`` times, each at both concurrencies
    their sweeps found best (more clients alone can raise throughput), each side's round
    counting its best point within the budget; the tuned one wins when its median ratio
    pays and it kept the budget in most rounds.

    The first round always runs (the search kept time for all of them); a later one only
    when ``time_left()`` still holds the longest round so far, so a run slowed down
    after the search ends with fewer rounds, said in the verdict, not past its budget."""
    levels = sorted({current.concurrency or 1, tuned.concurrency or 1})
    pairs: list[ABRound] = []
    longest = 0.0
    while len(pairs) < rounds and (not pairs or time_left() >= longest):
        before = time_left()
        pairs.append(
            ABRound(_best_point(current, levels, measure, p99_budget_ms),
                    _best_point(tuned, levels, measure, p99_budget_ms))
        )  # fmt: skip
        longest = max(longest, before - time_left())
    ran = len(pairs)
    cut = "" if ran == rounds else f" ({ran} of {rounds} rounds fitted the time budget)"
    ratio = statistics.median(_ratio(pair, p99_budget_ms) for pair in pairs)
    kept = sum(_within(pair.tuned, p99_budget_ms) for pair in pairs)
    if kept * 2 <= ran:
        verdict = f"the tuned configuration broke the p99 budget or failed in {ran - kept} of "
        verdict += f"{ran} rounds: the current configuration is best{cut}"
        return ABResult(pairs, ratio, False, verdict)
    if ratio < PAYS:
        verdict = f"the tuned configuration answered {ratio:.2f}x the current one's requests/s, "
        verdict += f"within noise: the current configuration is best{cut}"
        return ABResult(pairs, ratio, False, verdict)
    if math.isinf(ratio):
        verdict = f"the current configuration broke the p99 budget, the tuned one kept it{cut}"
        return ABResult(pairs, ratio, True, verdict)
    verdict = f"the tuned configuration answers {ratio:.2f}x requests/s{cut}"
    return ABResult(pairs, ratio, True, verdict)


def _best_point(
    trial: Trial,
    levels: Sequence[int],
    measure: Callable[[Settings, int], Point],
    p99_budget_ms: float | None,
) -> Point:
    """The best of ``trial`` measured at each of ``levels`` within the budget (else the
    last point, which shows why none was)."""
    points = [measure(trial.settings, level) for level in levels]
    within = [point for point in points if _within(point, p99_budget_ms)]
    return max(within, key=lambda point: point.throughput) if within else points[-1]


def _ratio(pair: ABRound, p99_budget_ms: float | None) -> float:
    """Tuned over current requests/s, a side that broke the budget counting 0 (so a
    current configuration that breaks it loses to any tuned one that keeps it)."""
    tuned = pair.tuned.throughput if _within(pair.tuned, p99_budget_ms) else 0.0
    current = pair.current.throughput if _within(pair.current, p99_budget_ms) else 0.0
    if current == 0.0:
        return math.inf if tuned else 0.0
    return tuned / current


def _within(point: Point, p99_budget_ms: float | None) -> bool:
    budget = math.inf if p99_budget_ms is None else p99_budget_ms
    return point.errors == 0 and point.throughput > 0 and point.p99_ms <= budget
