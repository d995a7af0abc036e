"""The tune search on known functions and a fake clock: it finds the optimum a cost model
gives, walks no blind grid, keeps its time budget, skips what fails, and the A/B decides."""

from __future__ import annotations

import pytest

from reposerve.config.parameters import check_parameters
from reposerve.config.schema import DynamicBatching, InstanceGroup, ModelConfig
from reposerve.tune.results import Point, Settings, Trial
from reposerve.tune.search import Search, ab_test, score
from reposerve.tune.space import Machine, knobs_for

pytestmark = pytest.mark.unit

# One batch costs FIXED + PER_ITEM * B + SQUARED * B^2 ms on one shared device, so
# throughput B / cost peaks at B = sqrt(FIXED / SQUARED) = 8, and instances add nothing.
FIXED, PER_ITEM, SQUARED = 16.0, 0.5, 0.25

SHIPPED = ModelConfig(
    backend="python", max_batch_size=32, instance_group=[InstanceGroup(kind="cpu", count=1)]
)


def _throughput(batch: int) -> float:
    return 1000 * batch / (FIXED + PER_ITEM * batch + SQUARED * batch**2)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _setup(
    deadline: float = 1e9,
    fail: set[int] = frozenset(),
    seconds: float = 10.0,
    first: float = 0.0,
    costs: tuple[float, ...] = (),
):
    knobs, _ = knobs_for(SHIPPED, "python", Machine(cores=2, gpus=0))
    clock = _Clock()
    tried: list[Settings] = []

    def configure(settings: Settings) -> dict[str, ModelConfig]:
        config = SHIPPED
        for knob in knobs:
            if settings["m"][knob.name] != knob.read(config):
                config = knob.write(config, settings["m"][knob.name])
        return {"m": config}

    def evaluate(settings: Settings, label: str) -> Trial:
        clock.now += costs[len(tried)] if costs else seconds
        tried.append(settings)
        batch = settings["m"]["max_batch_size"]
        if batch in fail:
            return Trial(label=label, settings=settings, status="failed", reason="load failed")
        return Trial(label=label, settings=settings, score=_throughput(batch), concurrency=16)

    baseline = Trial(
        label="current",
        settings={"m": {k.name: k.read(SHIPPED) for k in knobs}},
        score=_throughput(1),
    )
    search = Search(evaluate, configure, clock, lambda: deadline, first_estimate=first)
    return search, baseline, [("m", knob) for knob in knobs], tried


def test_finds_the_computed_best_batch_without_a_grid():
    search, baseline, plan, tried = _setup()
    best = search.run(baseline, plan)
    assert best.settings["m"]["max_batch_size"] == 8
    assert best.settings["m"]["instances"] == 1  # instances never paid on one device
    batches = [s["m"]["max_batch_size"] for s in tried]
    # up 2, 4, 8, 16 (stops paying), then one between 8 and its better neighbour
    assert batches[:5] == [2, 4, 8, 16, 6]
    assert 32 not in batches and 64 not in batches  # the walk stopped; no grid
    assert len(tried) < 12


def test_keeps_the_time_budget_and_says_what_it_left_out():
    search, baseline, plan, tried = _setup(deadline=35.0)
    best = search.run(baseline, plan)
    assert len(tried) == 3  # each trial costs 10 s: the fourth would end after 35 s
    assert best.settings["m"]["max_batch_size"] == 8
    assert any("time budget" in line for line in search.left_out)
    assert any(line.startswith("instances") for line in search.left_out)


def test_a_costly_trial_seen_once_is_expected_again():
    # The median (1 s after trials of 1, 9 and 1 s) let a fourth 9 s trial run past the deadline.
    costs = (1, 9, 1, 9, 1, 9, 1, 9)
    search, baseline, plan, tried = _setup(deadline=19.0, costs=costs)
    search.run(baseline, plan)
    assert len(tried) == 3
    assert sum(costs[: len(tried)]) <= 19.0


def test_a_failing_candidate_is_skipped_with_its_reason():
    search, baseline, plan, _ = _setup(fail={8})
    best = search.run(baseline, plan)
    failed = [t for t in search.trials if t.status == "failed"]
    assert [t.settings["m"]["max_batch_size"] for t in failed] == [8]
    assert failed[0].reason == "load failed"
    assert best.settings["m"]["max_batch_size"] == 4


def test_delay_is_left_out_while_batching_is_off():
    search, baseline, plan, _ = _setup(fail={2, 4, 8, 16, 32, 64, 128})
    search.run(baseline, plan)
    assert "max_queue_delay_microseconds: dynamic batching is off" in search.left_out


def test_score_is_the_best_point_within_the_p99_budget():
    points = [Point(1, 100, 5, 9), Point(4, 300, 10, 30), Point(16, 400, 40, 90, errors=1)]
    assert score(points, None) == (300, 4)  # the point with errors never counts
    assert score(points, 20) == (100, 1)
    assert score(points, 5) == (0.0, 0)


@pytest.mark.parametrize(
    ("tuned_rate", "tuned_p99", "wins"),
    [(200.0, 10.0, True), (101.0, 10.0, False), (300, 99, False)],
)
def test_ab_picks_the_tuned_one_only_when_it_pays_within_the_budget(tuned_rate, tuned_p99, wins):
    current = Trial(label="current", settings={"m": {"b": 1}}, concurrency=2)
    tuned = Trial(label="tuned", settings={"m": {"b": 8}}, concurrency=8)
    order = []

    def measure(settings: Settings, concurrency: int) -> Point:
        order.append(settings["m"]["b"])
        assert concurrency in (2, 8)
        if settings["m"]["b"] == 8:
            return Point(concurrency, tuned_rate, 5, tuned_p99)
        return Point(concurrency, 100.0, 5, 10)

    result = ab_test(current, tuned, measure, p99_budget_ms=50)
    assert order == [1, 1, 8, 8] * 3  # interleaved, each at both concurrencies
    assert result.tuned_wins is wins
    assert ("current configuration is best" in result.verdict) is not wins


def test_knobs_follow_the_backend_and_the_machine():
    onnx = ModelConfig(backend="onnxruntime", max_batch_size=0)
    knobs, left_out = knobs_for(onnx, "onnxruntime", Machine(cores=8, gpus=0))
    names = [k.name for k in knobs]
    assert names == ["instances", "intra_op_threads", "precision"]
    assert next(k for k in knobs if k.name == "intra_op_threads").ladder == (0, 1, 2, 4, 8)
    assert next(k for k in knobs if k.name == "precision").ladder == ("fp32", "fp16")
    assert any("max_batch_size is 0" in line for line in left_out)
    assert any("no GPU on this machine" in line for line in left_out)
    torch_gpu = ModelConfig(backend="torch", max_batch_size=4)
    knobs, _ = knobs_for(torch_gpu, "torch", Machine(cores=2, gpus=1))
    assert {"cudnn_benchmark", "torch_compile"} <= {k.name for k in knobs}


def test_knob_writes_read_back():
    batching = ModelConfig(
        backend="onnxruntime",
        max_batch_size=8,
        dynamic_batching=DynamicBatching(preferred_batch_size=[4, 8]),
    )
    knobs, _ = knobs_for(batching, "onnxruntime", Machine(cores=4, gpus=1))
    for knob in knobs:
        for value in knob.ladder:
            config = batching if knob.unusable(batching) else knob.write(batching, value)
            if not knob.unusable(batching):
                assert knob.read(config) == value, knob.name
    tensorrt = next(k for k in knobs if k.name == "tensorrt")
    assert tensorrt.write(batching, True).parameters == {"onnxruntime": {"tensorrt": {}}}
    for knob in knobs:  # every value written is one a load accepts
        for value in knob.ladder:
            if not knob.unusable(batching):
                check_parameters(knob.write(batching, value), "m/config.toml")
    assert tensorrt.write(tensorrt.write(batching, True), False).parameters == {"onnxruntime": {}}
    batch = knobs[0]
    assert batch.write(batching, 16).dynamic_batching.preferred_batch_size == []
    assert batch.write(batching, 1).dynamic_batching is None
    assert batch.write(batching, 1).max_batch_size == 8  # clients' own batches still fit


def test_the_first_trial_is_not_started_when_the_baseline_says_it_would_not_fit():
    search, baseline, plan, tried = _setup(deadline=5.0, first=10.0)
    best = search.run(baseline, plan)
    assert tried == [] and best is baseline
    assert any("time budget" in line for line in search.left_out)


def test_ab_prefers_a_tuned_config_that_keeps_the_budget_the_current_one_breaks():
    current = Trial(label="current", settings={"m": {"b": 1}}, concurrency=4)
    tuned = Trial(label="tuned", settings={"m": {"b": 8}}, concurrency=4)

    def measure(settings: Settings, concurrency: int) -> Point:
        if settings["m"]["b"] == 8:
            return Point(concurrency, 102.0, 5, 40)
        return Point(concurrency, 100.0, 5, 400)  # faster p50, but p99 over the budget

    result = ab_test(current, tuned, measure, p99_budget_ms=100)
    assert result.tuned_wins
    assert "current configuration broke the p99 budget" in result.verdict
    nothing = ab_test(current, tuned, lambda s, c: Point(c, 0.0, 1, 1), p99_budget_ms=None)
    assert not nothing.tuned_wins  # nothing answered on either side: no winner


def test_ab_runs_the_rounds_that_fit_the_time_left():
    current = Trial(label="current", settings={"m": {"b": 1}}, concurrency=2)
    tuned = Trial(label="tuned", settings={"m": {"b": 8}}, concurrency=2)
    clock = _Clock()

    def measure(settings: Settings, concurrency: int) -> Point:
        clock.now += 2.0  # a round measures each side once: 4 s
        return Point(concurrency, 200.0 if settings["m"]["b"] == 8 else 100.0, 5, 10)

    result = ab_test(current, tuned, measure, None, time_left=lambda: 10.0 - clock.now)
    assert len(result.rounds) == 2  # a third would have ended at 12 s
    assert clock.now <= 10.0
    assert result.tuned_wins and "2 of 3 rounds fitted the time budget" in result.verdict
    clock.now = 0.0
    late = ab_test(current, tuned, measure, None, time_left=lambda: -1.0 - clock.now)
    assert len(late.rounds) == 1  # the search kept time for it: the first always runs
