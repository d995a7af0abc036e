"""Every suite, most important first; `--suite NAME` picks from these."""

from __future__ import annotations

from ..spec import Suite
from . import backend_python

SUITES: dict[str, Suite] = {s.name: s for s in (backend_python.SUITE,)}
