"""Every suite, most important first; `--suite NAME` picks from these."""

from __future__ import annotations

from ..spec import Suite
from . import backend_python, composition, examples, http_generate, lifecycle, responses

_ORDER = (
    backend_python.SUITE,
    examples.SUITE,
    lifecycle.LIFECYCLE,
    responses.DECOUPLED_SUITE,
    composition.BLS,
    composition.IO,
    responses.PARAMETERS,
    responses.RESPONSE_SENDER,
    lifecycle.MODEL_CONTROL,
    composition.CUSTOM_METRICS,
    composition.ARGUMENT_VALIDATION,
    responses.ASYNC_EXECUTE,
    composition.ENSEMBLE,
    lifecycle.RESTART,
    responses.REQUEST_RESCHEDULING,
    lifecycle.MODEL_READINESS,
    lifecycle.LOGGING,
    http_generate.SUITE,
)
SUITES: dict[str, Suite] = {s.name: s for s in _ORDER}
