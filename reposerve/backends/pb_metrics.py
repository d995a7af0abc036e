"""``pb_utils.MetricFamily`` and ``Metric``: a Triton python model's own Prometheus metrics.

Written from Triton's python-backend documentation and the behaviour its tests assert (no
code of Triton's). A family is known by its name: families made with the same name share
one (the first description stands; another kind is an error), and metrics of a family
with the same labels are one metric. A family lives while a ``MetricFamily`` object
names it; once the last is gone, its metrics refuse every operation.

Every change is sent to the front as a ``MetricState`` frame holding the metric's whole
state (and ``MetricFamilyGone`` when a family ends), and the front's ``GET /metrics``
shows it beside reposerve's own metrics. Values are kept here too, so ``value()`` needs
no round trip; each instance keeps its own.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence

from reposerve.backends.base import MetricFamilyGone, MetricState
from reposerve.backends.pb_errors import TritonModelException

_GONE = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."

Send = Callable[[MetricState | MetricFamilyGone], None]


class _Family:
    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.holders = 0  # MetricFamily objects naming it
        self.metrics: dict[tuple[tuple[str, str], ...], _State] = {}


class _State:
    def __init__(self, buckets: list[float]) -> None:
        self.value = 0.0
        self.buckets = buckets
        self.bucket_counts = [0] * len(buckets)
        self.count = 0
        self.holders = 0  # Metric objects naming it


class _Registry:
    """The instance's families, shared by every MetricFamily object of the model."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, _Family] = {}
        self.send: Send | None = None  # set once the instance has a channel

    def publish(
        self, family: _Family, labels: tuple[tuple[str, str], ...], state: _State | None
    ) -> None:
        if self.send is None:
            return
        if state is None:
            self.send(
                MetricState(
                    family.name, family.description, family.kind, list(labels), removed=True
                )
            )
            return
        self.send(
            MetricState(
                family.name,
                family.description,
                family.kind,
                list(labels),
                state.value,
                state.buckets,
                list(state.bucket_counts),
                state.count,
            )
        )


_registry = _Registry()


def connect(send: Send | None) -> None:
    """Where the instance's metric frames go (the worker's channel)."""
    _registry.send = send


class MetricFamily:
    """A named family of metrics of one kind (COUNTER, GAUGE or HISTOGRAM)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"

    def __init__(self, name: str, description: str, kind: str) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"MetricFamily: name must be a non-empty str, got {name!r}")
        if not isinstance(description, str):
            raise TypeError(f"MetricFamily: description must be a str, got {type(description)}")
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException(f"MetricFamily '{name}': unknown kind {kind!r}")
        with _registry.lock:
            family = _registry.families.get(name)
            if family is None:
                family = _registry.families[name] = _Family(name, description, kind)
            elif family.kind != kind:
                raise TritonModelException(
                    f"Metric family with the same name '{name}' but different kind "
                    f"'{family.kind}' already exists"
                )
            family.holders += 1
        self._family = family

    def Metric(  # noqa: N802 - Triton's name
        self, labels: dict[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        return Metric(self._family, labels or {}, buckets)

    def __del__(self) -> None:
        family: _Family | None = getattr(self, "_family", None)
        if family is None:  # __init__ raised
            return
        with _registry.lock:
            family.holders -= 1
            if family.holders or _registry.families.get(family.name) is not family:
                return
            del _registry.families[family.name]
            family.metrics.clear()
        if _registry.send is not None:
            _registry.send(MetricFamilyGone(family.name))


class Metric:
    """One metric of a family, by its labels: a counter or gauge value, or a histogram."""

    def __init__(
        self, family: _Family, labels: dict[str, str], buckets: Sequence[float] | None
    ) -> None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TypeError("Metric: labels must map str to str")
        histogram = family.kind == MetricFamily.HISTOGRAM
        if histogram:
            if buckets is None:
                raise TritonModelException(
                    f"Metric of histogram family '{family.name}' needs buckets (a list of "
                    "increasing upper bounds)"
                )
            bounds = [float(bound) for bound in buckets]
            if any(later <= earlier for earlier, later in zip(bounds, bounds[1:], strict=False)):
                raise TritonModelException(
                    f"Metric of histogram family '{family.name}': buckets must increase, got "
                    f"{list(buckets)}"
                )
        else:
            bounds = []
        self._family = family
        self._labels = tuple(sorted(labels.items()))
        with _registry.lock:
            state = family.metrics.get(self._labels)
            if state is None:
                state = family.metrics[self._labels] = _State(bounds)
            state.holders += 1
        self._state = state
        _registry.publish(family, self._labels, state)

    def value(self) -> float:
        self._check("value", histogram_allowed=False)
        return self._state.value

    def increment(self, value: float) -> None:
        self._check("increment", histogram_allowed=False)
        if self._family.kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException(
                f"Metric '{self._family.name}': a counter cannot go down ({value})"
            )
        with _registry.lock:
            self._state.value += value
        _registry.publish(self._family, self._labels, self._state)

    def set(self, value: float) -> None:
        self._check("set", histogram_allowed=False)
        if self._family.kind == MetricFamily.COUNTER:
            raise TritonModelException(f"Metric '{self._family.name}': a counter cannot be set")
        with _registry.lock:
            self._state.value = float(value)
        _registry.publish(self._family, self._labels, self._state)

    def observe(self, value: float) -> None:
        self._check("observe", histogram_allowed=True)
        if self._family.kind != MetricFamily.HISTOGRAM:
            raise TritonModelException(
                f"Metric '{self._family.name}': observe() is for histograms, this is a "
                f"{self._family.kind}"
            )
        state = self._state
        with _registry.lock:
            state.value += value
            state.count += 1
            # Per bucket, not cumulative: the front adds them up as it shows them.
            index = bisect.bisect_left(state.buckets, value)
            if index < len(state.buckets):
                state.bucket_counts[index] += 1
        _registry.publish(self._family, self._labels, state)

    def _check(self, operation: str, histogram_allowed: bool) -> None:
        if _registry.families.get(self._family.name) is not self._family:
            raise TritonModelException(_GONE)
        if self._family.kind == MetricFamily.HISTOGRAM and not histogram_allowed:
            raise TritonModelException(
                f"Metric '{self._family.name}': {operation}() is not for histograms; use observe()"
            )

    def __del__(self) -> None:
        state = getattr(self, "_state", None)
        if state is None:  # __init__ raised
            return
        family = self._family
        with _registry.lock:
            state.holders -= 1
            if state.holders or family.metrics.get(self._labels) is not state:
                return
            del family.metrics[self._labels]
        if _registry.families.get(family.name) is family:
            _registry.publish(family, self._labels, None)
