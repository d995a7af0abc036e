"""python -m tools.bench SCENARIO [--duration S] [--plot out.png] [--json out.json]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec
import uvloop

from tools.bench.plot import plot
from tools.bench.scenarios import SCENARIOS


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    parser.add_argument("--plot", type=Path, help="draw the results to this PNG")
    parser.add_argument("--json", type=Path, help="write the full results as JSON")
    args = parser.parse_args()
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    reports = []
    for name in names:
        duration = max(args.duration, 10.0) if name == "async-sleep" else args.duration
        report = uvloop.run(SCENARIOS[name](duration))
        print(report.text(), flush=True)
        reports.append(report)
    if args.plot:
        for report in reports:
            path = (
                args.plot
                if len(reports) == 1
                else args.plot.with_stem(f"{args.plot.stem}-{report.scenario}")
            )
            plot(report.results, path, report.scenario)
    if args.json:
        args.json.write_bytes(msgspec.json.format(msgspec.json.encode(reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
