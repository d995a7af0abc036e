"""The Prometheus exposition of the repository's models (``GET /metrics``).

``reposerve.metrics`` defines every metric and renders them from plain values; this module
reads those values off the loaded versions (their statistics, queues and instances) and the
residency book, which the metrics leaf may not import.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from reposerve.metrics import CustomFamily, MetricsOptions, VersionMetrics, render
from reposerve.repository.manager import Repository
from reposerve.utilization import Usage


def exposition(
    repository: Repository,
    options: MetricsOptions,
    usage: Usage | None = None,
    server: Iterable[CustomFamily] = (),
) -> bytes:
    """The Prometheus exposition; ``usage`` is the last CPU/GPU sample, if any;
    ``server``: the server's own families beside the models' (its fronts')."""
    return render(
        (
            VersionMetrics(
                v.statistics.snapshot(),
                v.scheduler.pending,
                v.ready,
                v.restarts,
                v.statistics.failures,
                v.statistics.latencies,
            )
            for v in repository.loaded()
        ),
        options,
        usage,
        itertools.chain(
            server,
            _residency_families(repository),
            (
                family
                for version in repository.loaded()
                for instance in version.instances
                for family in instance.custom_metrics.families()
            ),
        ),
    )


def _residency_families(repository: Repository) -> list[CustomFamily]:
    """Loads, evictions and resident bytes, where models come and go on their own
    (on-demand mode, or a memory budget: what the residency book tracks)."""
    residency = repository.residency
    if not residency.tracking:
        return []
    return residency.families(repository.keeper.resident_bytes())
