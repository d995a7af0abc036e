"""Per model version inference statistics, in the shape of Triton's statistics extension.

Recorded once per batch (never per request on the hot path beyond a few additions) and
read by ``GET /v2/models/.../stats`` and the Prometheus metrics. Failure reasons and the
latency quantiles are kept beside Triton's document, for the metrics only.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence

import msgspec

from reposerve.quantiles import WindowedQuantiles


class Duration(msgspec.Struct):
    count: int = 0
    ns: int = 0

    def add(self, count: int, ns: int) -> None:
        self.count += count
        self.ns += ns


class InferenceStats(msgspec.Struct):
    success: Duration = msgspec.field(default_factory=Duration)
    fail: Duration = msgspec.field(default_factory=Duration)
    queue: Duration = msgspec.field(default_factory=Duration)
    compute_input: Duration = msgspec.field(default_factory=Duration)
    compute_infer: Duration = msgspec.field(default_factory=Duration)
    compute_output: Duration = msgspec.field(default_factory=Duration)
    cache_hit: Duration = msgspec.field(default_factory=Duration)
    cache_miss: Duration = msgspec.field(default_factory=Duration)


class BatchStats(msgspec.Struct):
    batch_size: int
    compute_input: Duration = msgspec.field(default_factory=Duration)
    compute_infer: Duration = msgspec.field(default_factory=Duration)
    compute_output: Duration = msgspec.field(default_factory=Duration)


class IsolationStats(msgspec.Struct):
    """Fault isolation (reposerve's addition to Triton's shape): failed batches of several
    requests re-run in halves so that only the requests at fault fail."""

    batches: int = 0  # batches that failed and were re-run in parts
    executions: int = 0  # executions spent re-running those parts
    failed_requests: int = 0  # requests found at fault and failed alone


class PaddingStats(msgspec.Struct):
    """Variable-length batching (reposerve's addition): how much of the padded inputs'
    batches was padding. ``padding / elements`` is the share spent on it."""

    batches: int = 0  # batches formed with padded inputs
    elements: int = 0  # elements of the padded inputs in those batches, padding included
    padding: int = 0  # of which padding


class MemoryUsage(msgspec.Struct):
    """Memory a model holds on one device (Triton's shape)."""

    type: str  # "CPU", "CPU_PINNED", "GPU"
    id: int
    byte_size: int


class ModelStats(msgspec.Struct):
    """One entry of Triton's ``model_stats`` list."""

    name: str
    version: str
    last_inference: int = 0  # ms since the epoch
    inference_count: int = 0  # items (batch elements) inferred
    execution_count: int = 0  # batches executed
    inference_stats: InferenceStats = msgspec.field(default_factory=InferenceStats)
    batch_stats: list[BatchStats] = []
    memory_usage: list[MemoryUsage] = []
    isolation_stats: IsolationStats = msgspec.field(default_factory=IsolationStats)
    padding_stats: PaddingStats = msgspec.field(default_factory=PaddingStats)


class FailureReason(enum.Enum):
    """Triton's ``reason`` label of ``nv_inference_request_failure``."""

    REJECTED = "REJECTED"  # refused or timed out by the scheduler (queue full, queue timeout)
    CANCELED = "CANCELED"  # its caller went away while it waited
    BACKEND = "BACKEND"  # the model (or its instance process) failed running it
    OTHER = "OTHER"  # anything else: the version unloading or without a live instance


class LatencySummaries:
    """Per request latencies (success only, warmup excluded) for the ``*_summary_us``
    metrics, in microseconds. Compute times are the batch's, counted for each request."""

    def __init__(self) -> None:
        now = time.monotonic_ns()
        self.request = WindowedQuantiles(now)
        self.queue = WindowedQuantiles(now)
        self.compute_input = WindowedQuantiles(now)
        self.compute_infer = WindowedQuantiles(now)
        self.compute_output = WindowedQuantiles(now)

    def record(
        self,
        request_ns: Sequence[int],
        queue_ns: Sequence[int],
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        now_ns = time.monotonic_ns()  # the window's own clock, the one scrapes read it by
        for part in self.parts():
            part.advance(now_ns)
        self.request.add_all(request_ns, 0.001)
        self.queue.add_all(queue_ns, 0.001)
        requests = len(request_ns)
        self.compute_input.add(input_ns / 1000, requests)
        self.compute_infer.add(infer_ns / 1000, requests)
        self.compute_output.add(output_ns / 1000, requests)

    def parts(self) -> tuple[WindowedQuantiles, ...]:
        """In the order of ``SUMMARIES`` in reposerve.metrics."""
        return (
            self.request,
            self.queue,
            self.compute_input,
            self.compute_infer,
            self.compute_output,
        )


class ModelStatistics:
    """Accumulates one model version's numbers; ``snapshot`` gives Triton's JSON shape."""

    def __init__(self, name: str, version: int, latency_summaries: bool = False) -> None:
        self._stats = ModelStats(name=name, version=str(version))
        self._by_batch_size: dict[int, BatchStats] = {}
        self.failures: dict[FailureReason, int] = dict.fromkeys(FailureReason, 0)
        # Recorded only when the summaries are shown: a few microseconds a batch, and a
        # couple per request, that nobody else reads.
        self.latencies = LatencySummaries()
        self._summaries = latency_summaries

    def record_batch(
        self,
        items: int,
        requests: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        success_ns: int,
        queue_ns: int,
    ) -> None:
        stats = self._stats
        stats.last_inference = time.time_ns() // 1_000_000
        stats.inference_count += items
        stats.execution_count += 1
        inference = stats.inference_stats
        inference.success.add(requests, success_ns)
        inference.queue.add(requests, queue_ns)
        # Triton splits batch durations over the requests in the inference totals.
        inference.compute_input.add(requests, input_ns * requests)
        inference.compute_infer.add(requests, infer_ns * requests)
        inference.compute_output.add(requests, output_ns * requests)
        by_size = self._by_batch_size.get(items)
        if by_size is None:
            by_size = self._by_batch_size[items] = BatchStats(items)
            stats.batch_stats = sorted(self._by_batch_size.values(), key=lambda b: b.batch_size)
        by_size.compute_input.add(1, input_ns)
        by_size.compute_infer.add(1, infer_ns)
        by_size.compute_output.add(1, output_ns)

    def record_latencies(
        self,
        request_ns: Sequence[int],
        queue_ns: Sequence[int],
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        """Each served request's latencies, for the quantile summaries."""
        if self._summaries:
            self.latencies.record(request_ns, queue_ns, input_ns, infer_ns, output_ns)

    def record_failure(
        self, requests: int, ns: int, reason: FailureReason, isolated: bool = False
    ) -> None:
        self._stats.inference_stats.fail.add(requests, ns)
        self.failures[reason] += requests
        if isolated:
            self._stats.isolation_stats.failed_requests += requests

    def record_split(self, rerun: bool) -> None:
        """A failed batch is run again as two parts; ``rerun``: it was such a part itself."""
        isolation = self._stats.isolation_stats
        isolation.batches += not rerun
        isolation.executions += 2

    def record_padding(self, elements: int, padding: int) -> None:
        """A batch of padded inputs was formed: ``padding`` of its ``elements`` are pad."""
        stats = self._stats.padding_stats
        stats.batches += 1
        stats.elements += elements
        stats.padding += padding

    def snapshot(self) -> ModelStats:
        return self._stats
