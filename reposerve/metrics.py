"""Prometheus metrics in Triton's names, rendered at scrape time from the statistics each
model version keeps (recorded once per batch), so serving pays nothing per request.

Triton exposes its counters without the ``_total`` suffix (``nv_inference_count``), and
its tools read them by those names; the text format is written here to keep them exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from reposerve.statistics import ModelStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class VersionMetrics(msgspec.Struct, frozen=True):
    """One model version's numbers at scrape time."""

    stats: ModelStats
    pending: int  # requests accepted, not running on an instance now
    ready: bool  # READY with a live instance
    restarts: int  # instance deaths handled by restarting


_Value = Callable[[VersionMetrics], float]

COUNTERS: list[tuple[str, str, _Value]] = [
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        lambda m: m.stats.inference_stats.success.count,
    ),
    (
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        lambda m: m.stats.inference_stats.fail.count,
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


def render(versions: Iterable[VersionMetrics]) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of every metric for ``versions``."""
    versions = list(versions)
    lines: list[str] = []
    for kind, table in (("counter", COUNTERS), ("gauge", GAUGES)):
        for name, description, value in table:
            lines.append(f"# HELP {name} {description}")
            lines.append(f"# TYPE {name} {kind}")
            for metrics in versions:
                labels = f'model="{_escape(metrics.stats.name)}",version="{metrics.stats.version}"'
                lines.append(f"{name}{{{labels}}} {value(metrics)}")
    return ("\n".join(lines) + "\n").encode()


def _escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
