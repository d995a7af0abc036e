"""CLI: pick suites, run them, print the cases and the totals, write the JSON."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import time
from pathlib import Path

from . import server
from .runner import main_run
from .suites import SUITES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.triton_qa", description=__doc__)
    parser.add_argument(
        "--server-repo", type=Path, required=True, help="triton-inference-server/server git dir"
    )
    parser.add_argument(
        "--backend-repo", type=Path, help="triton-inference-server/python_backend git dir"
    )
    parser.add_argument(
        "--suite",
        action="append",
        choices=list(SUITES),
        help="run only these (repeatable); default all",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="results.json, logs/ and the work tree (default /tmp/triton_qa-TIME)",
    )
    parser.add_argument(
        "--timeout", type=float, help="cap each client run at this many seconds (default 900)"
    )
    parser.add_argument(
        "--server-args",
        default="",
        help="more reposerve flags for every server, as one string ('--http-workers 2')",
    )
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, suite in SUITES.items():
            print(f"{name}: {len(suite.steps)} server starts")
        return 0
    server.EXTRA_ARGS[:] = shlex.split(args.server_args)
    out = args.out or Path(f"/tmp/triton_qa-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    names = args.suite or list(SUITES)
    started = time.monotonic()
    # A SIGTERM (a timeout around the run) unwinds like an error, and no server is left
    # on Triton's ports for the next run.
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    try:
        runner = main_run(
            [SUITES[n] for n in names], args.server_repo, args.backend_repo, out, args.timeout
        )
    finally:
        server.kill_all()
    totals = {s: sum(1 for c in runner.cases if c.status == s) for s in ("PASS", "FAIL", "SKIP")}
    print(f"{totals['PASS']} passed, {totals['FAIL']} failed, {totals['SKIP']} skipped")
    result = {
        "suites": names,
        "seconds": round(time.monotonic() - started),
        "totals": {"passed": totals["PASS"], "failed": totals["FAIL"], "skipped": totals["SKIP"]},
        "cases": [vars(c) for c in runner.cases],
        "steps": runner.steps,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"results: {out / 'results.json'}", file=sys.stderr)
    return 1 if totals["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
