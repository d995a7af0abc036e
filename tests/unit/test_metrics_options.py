"""The metrics flags (Triton's names and defaults) and what each setting changes in the
exposition."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reposerve.cli import serve_parser, settings_from
from reposerve.metrics import DEFAULT_QUANTILES, MetricsOptions, VersionMetrics, render
from reposerve.statistics import FailureReason, ModelStatistics

pytestmark = pytest.mark.unit


def _options(*argv: str) -> MetricsOptions:
    return settings_from(serve_parser().parse_args(list(argv))).metrics


def test_defaults_are_tritons():
    options = _options()
    assert options == MetricsOptions()
    assert (options.address, options.interval_ms) == (None, 2000.0)
    assert (options.counter_latencies, options.summary_latencies) == (True, False)
    assert options.summary_quantiles == DEFAULT_QUANTILES
    assert (options.cpu, options.gpu) == (True, True)


def test_flags_reach_the_options():
    options = _options(
        "--metrics-address", "127.0.0.2",
        "--metrics-interval-ms", "250",
        "--metrics-config", "summary_latencies=true",
        "--metrics-config", "counter_latencies=false",
        "--metrics-config", "summary_quantiles=0.5:0.05, 0.99:0.001",
        "--allow-gpu-metrics", "false",
    )  # fmt: skip
    assert options == MetricsOptions(
        address="127.0.0.2",
        interval_ms=250.0,
        counter_latencies=False,
        summary_latencies=True,
        summary_quantiles=((0.5, 0.05), (0.99, 0.001)),
        gpu=False,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--metrics-config", "histogram_latencies=true"],
            "expected SETTING=VALUE with SETTING one of counter_latencies, summary_latencies, "
            "summary_quantiles, got 'histogram_latencies=true'",
        ),
        (
            ["--metrics-config", "summary_latencies=yes"],
            "summary_latencies expects true or false, got 'yes'",
        ),
        (
            ["--metrics-config", "summary_quantiles=0.5,0.9:0.01"],
            "summary_quantiles expects QUANTILE:ERROR[,QUANTILE:ERROR...] with both in 0..1 "
            "(Triton's format, e.g. 0.5:0.05,0.99:0.001), got '0.5,0.9:0.01'",
        ),
        (["--metrics-interval-ms", "0"], "expected milliseconds > 0, got '0'"),
    ],
)
def test_bad_settings_are_refused_saying_what_is_expected(argv, message, capsys):
    with pytest.raises(SystemExit):
        serve_parser().parse_args(argv)
    assert message in capsys.readouterr().err


def _version() -> VersionMetrics:
    statistics = ModelStatistics("m", 1, latency_summaries=True)
    statistics.record_latencies([2000, 4000], [0, 1000], 10_000, 500_000, 20_000)
    statistics.record_failure(1, 0, FailureReason.BACKEND)
    return VersionMetrics(
        statistics.snapshot(), 0, True, 0, statistics.failures, statistics.latencies
    )


def _families(options: MetricsOptions) -> dict:
    text = render([_version()], options).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_summaries_show_only_when_asked_and_counters_hide_when_asked():
    default = _families(MetricsOptions())
    assert "nv_inference_queue_duration_us" in default
    assert not any(name.endswith("_summary_us") for name in default)
    failures = {
        s.labels["reason"]: s.value for s in default["nv_inference_request_failure"].samples
    }
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}

    families = _families(
        MetricsOptions(
            counter_latencies=False,
            summary_latencies=True,
            summary_quantiles=((0.5, 0.05), (0.99, 0.001)),
        )
    )
    assert not any(name.endswith("_duration_us") for name in families)
    samples = {
        (s.name, s.labels.get("quantile")): s.value
        for s in families["nv_inference_request_summary_us"].samples
    }
    assert families["nv_inference_request_summary_us"].type == "summary"
    assert samples == {
        ("nv_inference_request_summary_us", "0.5"): pytest.approx(2, rel=0.01),
        ("nv_inference_request_summary_us", "0.99"): pytest.approx(4, rel=0.01),
        ("nv_inference_request_summary_us_count", None): 2,
        ("nv_inference_request_summary_us_sum", None): 6.0,
    }
    infer = {s.name: s.value for s in families["nv_inference_compute_infer_summary_us"].samples}
    assert infer["nv_inference_compute_infer_summary_us_count"] == 2  # the batch, per request
    assert infer["nv_inference_compute_infer_summary_us_sum"] == 1000.0
