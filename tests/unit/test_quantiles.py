"""The windowed quantile sketch behind the ``*_summary_us`` metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reposerve.quantiles import RELATIVE_ERROR, WINDOW_NS, WindowedQuantiles

pytestmark = pytest.mark.unit

S = 1_000_000_000
WANTED = [0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]


def test_every_quantile_is_within_the_relative_error_of_the_exact_one():
    values = np.random.default_rng(7).lognormal(mean=6, sigma=1.5, size=20_000)
    sketch = WindowedQuantiles(now_ns=0)
    for value in values:
        sketch.add(float(value))
    ordered = np.sort(values)
    for quantile, estimate in zip(WANTED, sketch.quantiles(WANTED, now_ns=S), strict=True):
        exact = ordered[max(math.ceil(quantile * len(values)) - 1, 0)]  # nearest rank
        assert abs(estimate - exact) <= RELATIVE_ERROR * exact * 1.0001, quantile
    assert sketch.count == len(values)
    assert sketch.total == pytest.approx(values.sum())


def test_a_weight_counts_like_repeated_values_and_zero_is_kept():
    weighted, repeated = WindowedQuantiles(0), WindowedQuantiles(0)
    weighted.add(250.0, 3)
    weighted.add(0.0, 1)
    for value in (250.0, 250.0, 250.0, 0.0):
        repeated.add(value)
    assert weighted.quantiles(WANTED, 0) == repeated.quantiles(WANTED, 0)
    near_250 = pytest.approx(250, rel=RELATIVE_ERROR)
    assert weighted.quantiles([0.0, 0.5, 1.0], 0) == [0.0, near_250, near_250]
    assert (weighted.count, weighted.total) == (4, 750.0)


def test_values_leave_the_window_after_48_to_60_seconds_but_stay_in_count_and_sum():
    sketch = WindowedQuantiles(now_ns=0)
    sketch.add(1000.0)
    assert sketch.quantiles([0.5], now_ns=47 * S) == [pytest.approx(1000, rel=0.01)]
    sketch.add(10.0)  # into the slot that is newest at 47 s
    (median,) = sketch.quantiles([0.0], now_ns=WINDOW_NS + 1)
    assert median == pytest.approx(10, rel=0.01)  # the first value has gone
    assert math.isnan(sketch.quantiles([0.5], now_ns=3 * WINDOW_NS)[0])  # empty window
    assert (sketch.count, sketch.total) == (2, 1010.0)
