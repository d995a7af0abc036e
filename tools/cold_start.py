"""What a replica's cold start costs, the wait a request has when KEDA scales from zero:
reposerve started as a process, the time until it listens (live), until it is ready (every
model loaded and warmed), and its first inference right after ready against the second.

python -m tools.cold_start --model NAME [--model-repository PATH] [--runs N] [-- FLAGS...]

FLAGS go to reposerve (e.g. `--model-control-mode explicit --load-model add_sub` to start
with one model of the repository). Prints one line per run and the medians, in seconds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgspec

from reposerve.tune.client import ServerClient, requests_for
from tools.bench.servers import ROOT, free_port, reposerve_command, stop_process

POLL_S = 0.005  # the resolution of the live and ready times
START_LIMIT_S = 600.0


class ColdStart(msgspec.Struct, frozen=True):
    """One start, in seconds from the process's start (the last two: one request each)."""

    live_s: float
    ready_s: float
    first_answer_s: float
    first_request_s: float
    second_request_s: float


def _answers_200(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _until(process: subprocess.Popen, started: float, port: int, path: str) -> float:
    while not _answers_200(port, path):
        if process.poll() is not None:
            raise RuntimeError(f"reposerve exited with {process.returncode} before {path}")
        if time.perf_counter() - started > START_LIMIT_S:
            raise TimeoutError(f"{path}: no 200 after {START_LIMIT_S} s")
        time.sleep(POLL_S)
    return time.perf_counter() - started


def measure(repository: Path, model: str, flags: list[str]) -> ColdStart:
    """Start reposerve on ``repository`` and time its way to a first answer from ``model``."""
    port = free_port()
    started = time.perf_counter()
    process = subprocess.Popen(
        reposerve_command(repository, port, *flags),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        live_s = _until(process, started, port, "/v2/health/live")
        ready_s = _until(process, started, port, "/v2/health/ready")
        client = ServerClient(f"127.0.0.1:{port}")
        first, second = requests_for(client, model, count=2)
        sent = time.perf_counter()
        client.infer(model, first)
        answered = time.perf_counter()
        client.infer(model, second)
        return ColdStart(
            live_s=live_s,
            ready_s=ready_s,
            first_answer_s=answered - started,
            first_request_s=answered - sent,
            second_request_s=time.perf_counter() - answered,
        )
    finally:
        stop_process(process, grace_s=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the model the first request calls")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("flags", nargs="*", help="reposerve's own flags, after --")
    args = parser.parse_args(argv)
    runs = [measure(args.model_repository, args.model, args.flags) for _ in range(args.runs)]
    fields = ColdStart.__struct_fields__
    print("run  " + "  ".join(f"{field:>16}" for field in fields))
    for n, run in enumerate(runs, 1):
        print(f"{n:<4} " + "  ".join(f"{getattr(run, field):16.3f}" for field in fields))
    medians = [statistics.median(getattr(run, field) for run in runs) for field in fields]
    print("med  " + "  ".join(f"{median:16.3f}" for median in medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
