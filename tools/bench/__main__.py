"""Benchmarks with their baselines in the same run, and a load generator for any model.

python -m tools.bench SCENARIO [--duration S] [--plot out.png] [--json out.json]
python -m tools.bench load --url HOST:PORT --model NAME [--concurrency 1,8,32 | --rate R]
                           [--binary] [--batch N] [--shape NAME:D1,D2] [--duration S]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec
import uvloop

from reposerve.tune.client import ServerClient, requests_for
from reposerve.tune.load import RunResult, closed_loop, open_loop
from tools.bench import wrk
from tools.bench.compare import compare
from tools.bench.fronts import fronts, grpc_servers
from tools.bench.many_models import many_models
from tools.bench.openai_routes import openai_routes
from tools.bench.plot import plot, plot_fronts
from tools.bench.ray_proxy import ray_proxy
from tools.bench.scenarios import SCENARIOS as SCENARIO_TABLE
from tools.bench.scenarios import Report
from tools.bench.shared_memory import shared_memory_scenario
from tools.bench.tune_vs_analyzer import tune_vs_analyzer
from tools.bench.variable_length import variable_length

# Scenarios that `all` leaves out: tune-vs-analyzer runs two searches, about half an hour;
# many-models runs for minutes (its --duration, at least 60 s) over 6 GiB of models;
# variable-length exports its model with torch (the torch extra, and onnxscript);
# ray-proxy starts a Ray cluster (the ray extra).
ON_REQUEST = ("tune-vs-analyzer", "many-models", "variable-length", "ray-proxy")
SCENARIOS = {
    **SCENARIO_TABLE,
    "fronts": fronts,
    "grpc-servers": grpc_servers,
    "many-models": many_models,
    "openai": openai_routes,
    "ray-proxy": ray_proxy,
    "shared-memory": shared_memory_scenario,
    "tune-vs-analyzer": tune_vs_analyzer,
    "variable-length": variable_length,
}


def _shape(value: str) -> tuple[str, list[int]]:
    name, _, dims = value.partition(":")
    return name, [int(dim) for dim in dims.split(",") if dim]


async def _load(args: argparse.Namespace) -> Report:
    host, port = args.url.rsplit(":", 1)
    samples = requests_for(
        ServerClient(args.url), args.model, args.batch, args.binary, dict(args.shape or [])
    )
    requests = [sample.payload(host, args.model) for sample in samples]
    label = f"{args.model} {'binary' if args.binary else 'json'} batch {args.batch}"
    results: list[RunResult] = []
    if args.rate:
        results.append(await open_loop(label, host, int(port), requests, args.rate, args.duration))
    else:
        for concurrency in args.concurrency:
            run = await closed_loop(label, host, int(port), requests, concurrency, args.duration)
            print(run.line(), flush=True)
            results.append(run)
    return Report("load", results)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", choices=[*SCENARIOS, "all", "load", "compare"])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    parser.add_argument("--plot", type=Path, help="draw the results to this PNG")
    parser.add_argument("--json", type=Path, help="write the full results as JSON")
    parser.add_argument(
        "--base",
        default="HEAD",
        help="compare: the git revision this checkout is measured against (default HEAD)",
    )
    parser.add_argument(
        "--client",
        choices=["python", "wrk"],
        default="python",
        help="compare: the load generator (wrk leaves more of a small machine to the servers)",
    )
    load = parser.add_argument_group("load: drive a running server")
    load.add_argument("--url", default="127.0.0.1:8000", help="HOST:PORT of the server")
    load.add_argument("--model", help="the model to call (its metadata shapes the requests)")
    load.add_argument(
        "--concurrency",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[1, 8, 32],
        help="closed loop (load, compare): a sweep of client counts (default 1,8,32)",
    )
    load.add_argument("--rate", type=float, help="open loop: requests per second instead")
    load.add_argument("--binary", action="store_true", help="binary tensors instead of JSON")
    load.add_argument("--batch", type=int, default=1, help="items per request (batched models)")
    load.add_argument("--shape", type=_shape, action="append", help="NAME:D1,D2 for -1 dims")
    args = parser.parse_args()
    if args.scenario == "compare":
        if args.client == "wrk" and not wrk.available():
            parser.error("--client wrk: wrk is not on PATH (Debian/Ubuntu: apt install wrk)")
        concurrencies = tuple(args.concurrency)
        reports = [uvloop.run(compare(args.base, args.duration, concurrencies, client=args.client))]
        print(reports[0].text())
    elif args.scenario == "load":
        if not args.model:
            parser.error("load needs --model")
        reports = [uvloop.run(_load(args))]
        if args.rate:
            print(reports[0].text())
    else:
        everyday = [name for name in SCENARIOS if name not in ON_REQUEST]
        names = everyday if args.scenario == "all" else [args.scenario]
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
            draw = plot_fronts if report.scenario == "fronts" else plot
            draw(report.results, path, report.scenario)
    if args.json:
        args.json.write_bytes(msgspec.json.format(msgspec.json.encode(reports)))
    slides = [slide for report in reports for slide in report.slides]
    for slide in slides:
        print(f"overhead slid: {slide}", file=sys.stderr)
    return 1 if slides else 0


if __name__ == "__main__":
    sys.exit(main())
