"""The front's copy of an instance's own metrics (a Triton python model's custom metrics):
each ``MetricState`` frame replaces the metric it names, ``MetricFamilyGone`` drops a
family, and the metrics end with the process."""

from __future__ import annotations

from reposerve.backends.base import MetricFamilyGone, MetricState
from reposerve.metrics import CustomFamily, CustomMetric


class CustomMetrics:
    def __init__(self) -> None:
        self._families: dict[str, dict[tuple[tuple[str, str], ...], MetricState]] = {}

    def apply(self, message: MetricState | MetricFamilyGone) -> None:
        if isinstance(message, MetricFamilyGone):
            self._families.pop(message.family, None)
            return
        metrics = self._families.setdefault(message.family, {})
        labels = tuple((key, value) for key, value in message.labels)
        if message.removed:
            metrics.pop(labels, None)
        else:
            metrics[labels] = message

    def families(self) -> list[CustomFamily]:
        return [
            CustomFamily(
                name,
                first.description,
                first.kind,
                [
                    CustomMetric(labels, m.value, tuple(m.buckets), tuple(m.bucket_counts), m.count)
                    for labels, m in metrics.items()
                ],
            )
            for name, metrics in self._families.items()
            if metrics and (first := next(iter(metrics.values())))
        ]
