"""Whether Triton's perf_analyzer can run on this machine: the perf_analyzer tests and the
Model Analyzer test (which drives it) skip, saying why, where it cannot."""

from __future__ import annotations

import subprocess

from tools.bench.protocols import PERF_ANALYZER, perf_analyzer_environment


def why_perf_analyzer_cannot_run() -> str | None:
    """Why perf_analyzer cannot run here, or None when it can."""
    if not PERF_ANALYZER.exists():
        return f"{PERF_ANALYZER} is missing: install the test extra (tritonclient==2.51.0 ships it)"
    probe = subprocess.run(
        [str(PERF_ANALYZER), "--version"],
        capture_output=True,
        text=True,
        env=perf_analyzer_environment(),
    )
    if "error while loading shared libraries" in probe.stderr:
        why = probe.stderr.strip()
        return f"perf_analyzer cannot start: {why} (see tools/install_perf_analyzer.sh)"
    return None
