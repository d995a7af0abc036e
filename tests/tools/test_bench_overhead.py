"""The overhead benchmark's verdict on its ratios to the bare echo, and what a revision
compared with this one is started with: pure logic."""

from __future__ import annotations

import pytest

from reposerve.tune.load import RunResult
from tools.bench.compare import port_flags
from tools.bench.scenarios import echo_slides, median_run

pytestmark = pytest.mark.unit


def _ratio(concurrency: int) -> str:
    return f"c={concurrency} reposerve json / starlette echo throughput"


def test_a_ratio_under_its_floor_is_a_slide_and_one_at_or_over_it_is_not():
    facts = {_ratio(1): 0.29, _ratio(8): 0.30, _ratio(32): 0.70}
    (slide,) = echo_slides(facts, {1: 0.29, 8: 0.36, 32: 0.44})
    assert slide == (
        "c=8: reposerve json answered 0.30x the bare echo's requests/s, under the floor of 0.36x"
    )


def test_a_concurrency_not_measured_is_not_judged():
    assert echo_slides({_ratio(1): 0.1}, {8: 0.36}) == []


def _run(throughput: float) -> RunResult:
    return RunResult("x", "closed", 1, 0.0, 1.0, int(throughput), 0, throughput, 0, 0, 0, 0, 0)


def test_themedian_run_is_the_middle_one_by_throughput():
    assert median_run([_run(3), _run(1), _run(2)]).throughput == 2
    assert median_run([_run(4), _run(1), _run(3), _run(2)]).throughput == 2


def test_each_side_of_a_comparison_gets_free_ports_only_for_the_flags_it_offers():
    old = "usage: reposerve [--http-port HTTP_PORT] [--metrics-port METRICS_PORT]"
    flags = port_flags(old)
    assert flags[0] == "--metrics-port" and int(flags[1]) > 0 and len(flags) == 2
    both = port_flags("--grpc-port GRPC_PORT --metrics-port METRICS_PORT")
    assert both[0::2] == ["--grpc-port", "--metrics-port"]
    assert port_flags("usage: reposerve [--http-port HTTP_PORT]") == []
