"""Prometheus metrics in Triton's names, rendered at scrape time from the statistics each
model version keeps (recorded once per batch), so serving pays nothing per request.

Triton exposes its counters without the ``_total`` suffix (``nv_inference_count``), and
its tools read them by those names; the text format is written here to keep them exact.
What is shown follows Triton's ``--metrics-config`` settings (``MetricsOptions``):
latency counters (on by default), latency summaries with quantiles (off by default), and
the CPU/GPU gauges of the last ``reposerve.utilization`` sample.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import msgspec

from reposerve.statistics import FailureReason, LatencySummaries, ModelStats
from reposerve.utilization import Usage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Triton's default summary quantiles, as (quantile, allowed rank error) pairs.
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))


class MetricsOptions(msgspec.Struct, frozen=True, kw_only=True):
    """``--metrics-address``, ``--metrics-interval-ms``, ``--metrics-config`` and
    ``--allow-cpu-metrics``/``--allow-gpu-metrics``, with Triton's defaults."""

    address: str | None = None  # None: the --http-host address, as in Triton
    interval_ms: float = 2000.0  # how often CPU/GPU usage is sampled
    counter_latencies: bool = True  # nv_inference_*_duration_us
    summary_latencies: bool = False  # nv_inference_*_summary_us
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    cpu: bool = True
    gpu: bool = True


METRICS_SETTINGS = ("counter_latencies", "summary_latencies", "summary_quantiles")


def parse_metrics_setting(text: str) -> tuple[str, bool | tuple[tuple[float, float], ...]]:
    """One ``--metrics-config SETTING=VALUE``, checked; ValueError saying what is expected."""
    setting, equals, value = text.partition("=")
    setting = setting.strip()
    if not equals or setting not in METRICS_SETTINGS:
        raise ValueError(
            f"expected SETTING=VALUE with SETTING one of {', '.join(METRICS_SETTINGS)}, "
            f"got {text!r}"
        )
    if setting == "summary_quantiles":
        return setting, _quantiles(value)
    if value.strip().lower() not in ("true", "false"):
        raise ValueError(f"{setting} expects true or false, got {value!r}")
    return setting, value.strip().lower() == "true"


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    pairs = []
    for part in value.split(","):
        quantile, colon, error = part.strip().partition(":")
        try:
            pair = (float(quantile), float(error))
        except ValueError:
            pair = (math.nan, math.nan)
        if not colon or not (0 <= pair[0] <= 1 and 0 <= pair[1] <= 1):
            raise ValueError(
                "summary_quantiles expects QUANTILE:ERROR[,QUANTILE:ERROR...] with both in "
                f"0..1 (Triton's format, e.g. 0.5:0.05,0.99:0.001), got {value!r}"
            )
        pairs.append(pair)
    return tuple(pairs)


class VersionMetrics(msgspec.Struct, frozen=True):
    """One model version's numbers at scrape time."""

    stats: ModelStats
    pending: int  # requests accepted, not running on an instance now
    ready: bool  # READY with a live instance
    restarts: int  # instance deaths handled by restarting
    failures: dict[FailureReason, int]
    latencies: LatencySummaries


_Value = Callable[[VersionMetrics], float]

COUNTERS: list[tuple[str, str, _Value]] = [
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        lambda m: m.stats.inference_stats.success.count,
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda m: m.stats.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda m: m.stats.execution_count,
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds",
        lambda m: (m.stats.inference_stats.success.ns + m.stats.inference_stats.fail.ns) // 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds",
        lambda m: m.stats.inference_stats.queue.ns // 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds",
        lambda m: m.stats.inference_stats.compute_input.ns // 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds",
        lambda m: m.stats.inference_stats.compute_infer.ns // 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds",
        lambda m: m.stats.inference_stats.compute_output.ns // 1000,
    ),
    # reposerve's own, beside Triton's:
    (
        "reposerve_isolated_batch_count",
        "Failed batches of several requests re-run in parts so only the failing requests fail",
        lambda m: m.stats.isolation_stats.batches,
    ),
    (
        "reposerve_isolation_exec_count",
        "Model executions spent re-running parts of failed batches",
        lambda m: m.stats.isolation_stats.executions,
    ),
    (
        "reposerve_isolated_failure_count",
        "Requests found at fault by re-running their failed batch, and failed alone",
        lambda m: m.stats.isolation_stats.failed_requests,
    ),
    (
        "reposerve_padded_input_elements",
        "Elements of padded inputs in batches of requests of different lengths, padding included",
        lambda m: m.stats.padding_stats.elements,
    ),
    (
        "reposerve_padding_elements",
        "Of those, the elements that were padding (their share: this over the elements)",
        lambda m: m.stats.padding_stats.padding,
    ),
    (
        "reposerve_instance_restart_count",
        "Instance processes that died and were restarted (or given up on)",
        lambda m: m.restarts,
    ),
]
GAUGES: list[tuple[str, str, _Value]] = [
    (
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        lambda m: m.pending,
    ),
    (
        "reposerve_model_ready",
        "1 while the model version is READY with a live instance, else 0",
        lambda m: int(m.ready),
    ),
]


# Triton's summaries, in the order of LatencySummaries.parts().
SUMMARIES: list[tuple[str, str]] = [
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Summary of compute input duration in microseconds",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Summary of compute inference duration in microseconds",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Summary of inference compute output duration in microseconds",
    ),
]
CPU_GAUGES: list[tuple[str, str, str]] = [
    ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "utilization"),
    ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "memory_total"),
    ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "memory_used"),
]
GPU_GAUGES: list[tuple[str, str, str]] = [
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0]", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "memory_total"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "memory_used"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "power_w"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "power_limit_w"),
    ("nv_energy_consumption", "GPU energy consumption in joules since reposerve started",
     "energy_j"),
]  # fmt: skip


class CustomMetric(msgspec.Struct, frozen=True):
    """One of a model's own metrics: a counter or gauge ``value``, or a histogram (``value``
    its sum, ``bucket_counts`` per upper bound in ``buckets``, not cumulative)."""

    labels: tuple[tuple[str, str], ...]
    value: float
    buckets: tuple[float, ...] = ()
    bucket_counts: tuple[int, ...] = ()
    count: int = 0


class CustomFamily(msgspec.Struct, frozen=True):
    """A family of metrics a model made (Triton's python-backend custom metrics)."""

    name: str
    description: str
    kind: str  # "counter" | "gauge" | "histogram"
    metrics: list[CustomMetric]


def render(
    versions: Iterable[VersionMetrics],
    options: MetricsOptions = MetricsOptions(),  # noqa: B008 - frozen, shared safely
    usage: Usage | None = None,
    custom: Iterable[CustomFamily] = (),
) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of every metric for ``versions``,
    of ``usage`` (the last CPU/GPU sample) when given, and of the models' own metrics
    (families of one name, from several instances, shown as one)."""
    versions = list(versions)
    lines: list[str] = []
    for kind, table in (("counter", COUNTERS), ("gauge", GAUGES)):
        for name, description, value in table:
            if not options.counter_latencies and name.endswith("_duration_us"):
                continue
            _family(lines, name, description, kind)
            for metrics in versions:
                lines.append(f"{name}{{{_labels(metrics)}}} {_number(value(metrics))}")
    _failures(lines, versions)
    if options.summary_latencies:
        _summaries(lines, versions, options.summary_quantiles)
    if usage is not None:
        _usage(lines, usage)
    _custom(lines, custom)
    return ("\n".join(lines) + "\n").encode()


def _custom(lines: list[str], families: Iterable[CustomFamily]) -> None:
    merged: dict[str, list[CustomFamily]] = {}
    for family in families:
        merged.setdefault(family.name, []).append(family)
    for name, parts in merged.items():
        _family(lines, name, _escape(parts[0].description), parts[0].kind)
        for metric in (metric for part in parts for metric in part.metrics):
            pairs = ",".join(f'{key}="{_escape(value)}"' for key, value in metric.labels)
            labels = f"{{{pairs}}}" if pairs else ""  # no braces without labels
            if parts[0].kind != "histogram":
                lines.append(f"{name}{labels} {_value(metric.value)}")
                continue
            before = f"{pairs}," if pairs else ""
            total = 0
            for bound, count in zip(metric.buckets, metric.bucket_counts, strict=True):
                total += count
                lines.append(f'{name}_bucket{{{before}le="{_value(bound)}"}} {total}')
            lines.append(f'{name}_bucket{{{before}le="+Inf"}} {metric.count}')
            lines.append(f"{name}_count{labels} {metric.count}")
            lines.append(f"{name}_sum{labels} {_value(metric.value)}")


def _value(number: float) -> str:
    """A model's metric value as Prometheus' own clients print it: whole numbers without
    a fraction (``2023``, ``le="1"``), others in their shortest form."""
    if math.isfinite(number) and number == int(number):
        return str(int(number))
    return _number(float(number))


def _failures(lines: list[str], versions: list[VersionMetrics]) -> None:
    name = "nv_inference_request_failure"
    _family(lines, name, "Number of failed inference requests, all batch sizes", "counter")
    for metrics in versions:
        model = _escape(metrics.stats.name)
        for reason in FailureReason:  # every reason, 0 included, as Triton shows them
            labels = f'model="{model}",reason="{reason.value}",version="{metrics.stats.version}"'
            lines.append(f"{name}{{{labels}}} {metrics.failures[reason]}")


def _summaries(
    lines: list[str], versions: list[VersionMetrics], quantiles: tuple[tuple[float, float], ...]
) -> None:
    # The rank errors are Triton's knob for its estimator; ours is within 1 % of the value
    # at every quantile (reposerve.quantiles), so only the quantiles themselves matter.
    wanted = [quantile for quantile, _ in quantiles]
    now_ns = time.monotonic_ns()
    parts = [metrics.latencies.parts() for metrics in versions]
    for index, (name, description) in enumerate(SUMMARIES):
        _family(lines, name, description, "summary")
        for metrics, summaries in zip(versions, parts, strict=True):
            labels = _labels(metrics)
            summary = summaries[index]
            for quantile, value in zip(wanted, summary.quantiles(wanted, now_ns), strict=True):
                lines.append(f'{name}{{{labels},quantile="{quantile}"}} {_number(value)}')
            lines.append(f"{name}_count{{{labels}}} {summary.count}")
            lines.append(f"{name}_sum{{{labels}}} {_number(summary.total)}")


def _usage(lines: list[str], usage: Usage) -> None:
    if usage.cpu is not None:
        for name, description, field in CPU_GAUGES:
            _family(lines, name, description, "gauge")
            lines.append(f"{name} {_number(getattr(usage.cpu, field))}")
    for name, description, field in GPU_GAUGES:
        rows = [(gpu, getattr(gpu, field)) for gpu in usage.gpus]
        rows = [(gpu, value) for gpu, value in rows if value is not None]
        if rows:
            _family(lines, name, description, "gauge")
        for gpu, value in rows:
            lines.append(f'{name}{{gpu_uuid="{_escape(gpu.uuid)}"}} {_number(value)}')


def _family(lines: list[str], name: str, description: str, kind: str) -> None:
    lines.append(f"# HELP {name} {description}")
    lines.append(f"# TYPE {name} {kind}")


def _labels(metrics: VersionMetrics) -> str:
    return f'model="{_escape(metrics.stats.name)}",version="{metrics.stats.version}"'


def _number(value: float) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
    return str(value)


def _escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
