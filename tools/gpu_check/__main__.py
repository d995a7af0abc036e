"""``python -m tools.gpu_check``: the options, the time budget, each phase run into its
report (stopped by an alarm when the budget runs out, its servers stopped either way), one
printed line and one JSON document per phase, and the summary."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import tools.gpu_check
from tools.gpu_check.context import Run
from tools.gpu_check.faults import faults
from tools.gpu_check.node import Node
from tools.gpu_check.placement import placement
from tools.gpu_check.precision import precision
from tools.gpu_check.report import Phase, PhaseLine, PhaseReport, Summary, write
from tools.gpu_check.throughput import throughput

PHASE_FUNCTIONS: dict[str, Callable[[Run, Phase], None]] = {
    "placement": placement,
    "precision": precision,
    "throughput": throughput,
    "faults": faults,
}
PHASES = tuple(PHASE_FUNCTIONS)
# About how long each phase needs on a GPU node; one that would not fit is skipped.
ESTIMATE_S = {"placement": 40.0, "precision": 45.0, "throughput": 150.0, "faults": 60.0}


class BudgetExceeded(BaseException):
    """Raised by the timer in the main thread; a BaseException so that no ``except
    Exception`` on the way (HTTP retries, polling loops) swallows it."""


def _on_alarm(signum: int, frame: object) -> None:
    raise BudgetExceeded


def run_phase(run: Run, name: str, deadline: float) -> PhaseReport:
    phase = Phase(name)
    left = deadline - time.monotonic()
    if name not in run.args.phases:
        phase.skipped = "not selected (--phases)"
        return phase.report(0.0, None, {})
    if left < ESTIMATE_S[name]:
        phase.skipped = (
            f"time budget: {left:.0f} s left, this phase needs about {ESTIMATE_S[name]:g} s"
        )
        return phase.report(0.0, None, {})
    started = time.monotonic()
    error = None
    signal.setitimer(signal.ITIMER_REAL, max(left, 0.01))
    try:
        PHASE_FUNCTIONS[name](run, phase)
    except BudgetExceeded:
        error = f"stopped: the run's time budget (--budget-s {run.args.budget_s:g}) ran out"
    except Exception:
        error = traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        logs = run.stop_servers()
    return phase.report(time.monotonic() - started, error, logs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.gpu_check", description=tools.gpu_check.__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="folder for the JSON")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole run's limit")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, in order")
    parser.add_argument("--seconds", type=float, default=8.0, help="each throughput measurement")
    parser.add_argument("--cpu-smoke", action="store_true", help="throughput on a CPU, tiny")
    args = parser.parse_args(argv)
    args.phases = [name.strip() for name in args.phases.split(",") if name.strip()]
    unknown = sorted(set(args.phases) - set(PHASES))
    if unknown:
        parser.error(f"unknown phase(s) {unknown}; choose from {', '.join(PHASES)}")
    started = time.monotonic()
    deadline = started + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGALRM, _on_alarm)

    node = Node()
    where = ", ".join(f"{gpu.index}: {gpu.name} {gpu.uuid}" for gpu in node.gpus)
    print(
        f"gpu_check: {len(node.gpus)} GPU(s) {where or node.no_gpu_reason}; torch {node.torch} "
        f"(CUDA {'yes' if node.cuda else 'no'}); budget {args.budget_s:g} s; JSON in {args.out}/",
        flush=True,
    )
    lines = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
        run = Run(args, node, Path(workdir))
        for name in PHASES:
            report = run_phase(run, name, deadline)
            write(args.out / f"{name}.json", report)
            text = report.headline if report.status == "passed" else report.reason
            if report.status == "passed" and report.reason:
                text += f" [{report.reason}]"
            passed = sum(check.ok for check in report.checks)
            counts = f"{passed}/{len(report.checks)} checks"
            line = f"{name:<11} {report.status:<8} {report.seconds:6.1f} s  {counts:<11} {text}"
            print(line, flush=True)
            lines.append(PhaseLine(name, report.status, report.seconds, line))
    ok = all(line.status != "failed" for line in lines)
    summary = Summary(
        ok=ok,
        seconds=round(time.monotonic() - started, 1),
        budget_s=args.budget_s,
        python=sys.version.split()[0],
        torch=node.torch,
        cuda_available=node.cuda,
        gpus=node.gpus,
        no_gpu_reason=node.no_gpu_reason,
        phases=lines,
    )
    write(args.out / "summary.json", summary)
    failed = [line.phase for line in lines if line.status == "failed"]
    verdict = "PASS" if ok else f"FAIL ({', '.join(failed)})"
    print(f"gpu_check: {verdict} in {summary.seconds:g} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
