"""``reposerve tune MODEL``: search this machine for the model's best configuration,
measured on a server (one tune starts, or ``--url``), and recommend it only when it beats
the current one in an interleaved A/B."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from reposerve.arguments import positive
from reposerve.errors import ConfigError, TuneError
from reposerve.fronts import usable_cores
from reposerve.repository.gpus import discover
from reposerve.repository.roots import find_root
from reposerve.tune.client import ServerClient, requests_for
from reposerve.tune.configs import Recommendation, recommend, write
from reposerve.tune.progress import Progress
from reposerve.tune.report import summary, write_report
from reposerve.tune.requests import sample_requests
from reposerve.tune.results import ABResult, TuneResults
from reposerve.tune.runner import Runner, Sweep, targets_of
from reposerve.tune.search import AB_ROUNDS, Search, ab_test
from reposerve.tune.server import LocalServer
from reposerve.tune.space import Machine

DEFAULT_TIME_BUDGET_S = 600.0
DEFAULT_TOLERANCE = 1e-2
AB_MARGIN = 0.05  # of the time budget, kept free after the A/B's estimated rounds
# Ctrl-C, a SIGTERM, a closed terminal (SIGHUP): each stops the run the same way.
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """A signal stopped the run. It unwinds like an exception (not caught as one), so the
    server tune started stops, and a server tuned through --url gets its models back."""

    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number


def _interrupt(number: int, frame: object) -> None:
    # Only the first signal unwinds: the cleanup it runs is bounded (a server that does
    # not stop within STOP_GRACE_S is killed), and a second Ctrl-C would cut it short
    # with a traceback, leaving the server to its death signal.
    for each in STOPPING:
        signal.signal(each, signal.SIG_IGN)
    raise Interrupted(number)


def tune_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reposerve tune",
        description="Find the model's fastest configuration on this machine: each candidate "
        "is loaded with a config override, swept over concurrency and kept only when it "
        "pays; the best must beat the current configuration in an interleaved A/B.",
    )
    add = parser.add_argument
    add("model", metavar="MODEL", help="the model to tune (an ensemble tunes its steps)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--model-repository",
        type=Path,
        metavar="PATH",
        help="start a server on this repository for the run (default: model_repository)",
    )
    where.add_argument(
        "--url", metavar="HOST:PORT", help="tune on a running server instead (its HTTP port)"
    )
    add(
        "--inputs",
        type=Path,
        metavar="FILE|DIR",
        help="real samples: a folder of files for the model's BYTES input (JPEGs for an "
        "image model), or a JSON file of V2 requests (default: random data from metadata)",
    )
    add(
        "--concurrency",
        type=_concurrency,
        default=None,
        metavar="auto|LIST",
        help="client concurrencies to sweep, e.g. 1,4,16 (auto: doubling until throughput "
        "stops growing)",
    )
    add(
        "--p99-ms", type=positive("milliseconds"), metavar="BUDGET", help="p99 latency budget in ms"
    )
    add(
        "--time-budget",
        type=positive("seconds"),
        default=DEFAULT_TIME_BUDGET_S,
        metavar="SECONDS",
        help=f"the whole run's wall time (default {DEFAULT_TIME_BUDGET_S:g})",
    )
    add(
        "--tolerance",
        type=positive("a share"),
        default=DEFAULT_TOLERANCE,
        help="a lower precision is accepted only when outputs stay within this share of "
        f"the fp32 outputs' largest magnitude (default {DEFAULT_TOLERANCE:g})",
    )
    add("--out", type=Path, metavar="DIR", help="the report's folder (default tune-out/MODEL)")
    add(
        "--write",
        action="store_true",
        help="replace the model's config.toml by the recommended one (the previous is kept "
        "as config.toml.before-tune); needs --model-repository",
    )
    return parser


def _concurrency(value: str) -> tuple[int, ...] | None:
    if value == "auto":
        return None
    try:
        levels = tuple(sorted({int(part) for part in value.split(",")}))
    except ValueError:
        levels = ()
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError(f"expected auto or a list like 1,4,16, got {value!r}")
    return levels


def tune(argv: list[str]) -> int:
    parser = tune_parser()
    args = parser.parse_args(argv)
    if args.write and args.url:
        parser.error("--write needs --model-repository (the folder to write to)")
    repository = None if args.url else (args.model_repository or Path("model_repository"))
    out = args.out or Path("tune-out") / args.model
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()  # the budget counts the server's start too
    for number in STOPPING:
        signal.signal(number, _interrupt)
    try:
        with _server(args.url, repository, args.model, out) as client:
            results, recommendations = _run(args, client, repository, started)
        written = write_report(out, results, recommendations)
        changed = [r for r in recommendations if r.diff]
        for recommendation in changed if args.write else ():
            print(f"wrote {write(recommendation)}")
        if args.write and not changed:
            print("--write: nothing written, the current configuration stays")
    except TuneError as exc:
        print(f"reposerve tune: {exc.message}", file=sys.stderr)
        return 1
    except Interrupted as stop:
        left = (
            "the server it started has stopped"
            if args.url is None
            else f"{args.url} serves its models as they were"
        )
        name = signal.Signals(stop.number).name
        print(f"reposerve tune: interrupted by {name}; {left}", file=sys.stderr)
        return 128 + stop.number
    print(summary(results))
    print(f"report: {written[-1]}")
    return 0


@contextlib.contextmanager
def _server(url: str | None, repository: Path | None, model: str, out: Path) -> Iterator:
    if url is not None:
        yield ServerClient(url)
        return
    assert repository is not None
    if not (repository / model).is_dir():
        raise TuneError(f"{repository / model}: no such model folder")
    with LocalServer(repository, model, out / "server.log") as client:
        yield client


def _run(
    args: argparse.Namespace, client: ServerClient, repository: Path | None, started: float
) -> tuple[TuneResults, list[Recommendation]]:
    deadline = started + args.time_budget
    loaded_here = not client.ready(args.model)
    if loaded_here:  # a running server that has not loaded it: load it for the run
        client.load(args.model)
    runner = None
    try:
        # The machine tune runs on: with --url, the server's must be the same one.
        machine = Machine(usable_cores(), len(discover().visible))
        point = min(3.0, max(1.0, args.time_budget / 200))
        sweep = Sweep(args.concurrency, point, point / 4, args.p99_ms, args.tolerance)
        metadata = client.metadata(args.model)
        if args.inputs is not None:
            batched = client.config(args.model).get("max_batch_size", 0) > 0
            requests = sample_requests(args.inputs, metadata, batched)
        else:
            requests = requests_for(client, args.model)
        targets = targets_of(client, args.model)
        progress = Progress(started, args.time_budget)
        runner = Runner(client, args.model, targets, requests, sweep, machine, progress.point)
        baseline_started, busy_before = time.monotonic(), runner.busy_ns()
        baseline = runner.evaluate(runner.baseline, "current configuration")
        baseline.seconds = time.monotonic() - baseline_started
        busy = {name: ns - busy_before[name] for name, ns in runner.busy_ns().items()}
        progress.trial(baseline)
        if baseline.status != "measured":
            hint = "" if args.inputs else " Hint: give real samples with --inputs FILE|DIR"
            raise TuneError(f"the current configuration does not serve: {baseline.reason}.{hint}")

        # Each A/B round loads both sides and measures each at up to two concurrencies.
        def search_deadline() -> float:
            each_point = point + sweep.warmup_seconds + runner.point_overrun
            each_round = 4 * each_point + 2 * runner.load_seconds
            # What the estimate misses on a loaded machine (a slower load, a late answer)
            # comes out of a margin, not past the budget.
            return deadline - AB_ROUNDS * each_round - AB_MARGIN * args.time_budget

        search = Search(
            progress.timed(runner.evaluate), runner.configure, time.monotonic,
            search_deadline, models=len(targets), first_estimate=baseline.seconds,
        )  # fmt: skip
        best = search.run(baseline, runner.plan(busy))
        ab = None
        if best is not baseline:
            progress.note(f"A/B: current against {best.label}, {AB_ROUNDS} rounds")
            try:
                ab_deadline = deadline - AB_MARGIN / 2 * args.time_budget  # room to wrap up
                ab = ab_test(
                    baseline, best, runner.measure, args.p99_ms,
                    time_left=lambda: ab_deadline - time.monotonic(),
                )  # fmt: skip
            except (TuneError, OSError) as exc:  # the search's results still get reported
                reason = exc.message if isinstance(exc, TuneError) else str(exc)
                ab = ABResult([], 0.0, False, f"the A/B could not run ({reason}): nothing changes")
    finally:
        if args.url is not None:
            for problem in runner.restore() if runner is not None else ():
                print(f"reposerve tune: {problem}", file=sys.stderr)
            if loaded_here:
                client.unload(args.model)
    chosen = best.settings if ab is not None and ab.tuned_wins else baseline.settings
    recommendations = [
        recommend(
            target.name,
            target.config,
            runner.knobs[target.name],
            runner.baseline,
            chosen,
            _folder(repository, target.name),
        )
        for target in targets
    ]
    results = TuneResults(
        model=args.model,
        machine=machine,
        p99_budget_ms=args.p99_ms,
        time_budget_s=args.time_budget,
        seconds=time.monotonic() - started,
        baseline=baseline,
        trials=search.trials,
        best=best,
        ab=ab,
        recommended=chosen,
        left_out=runner.left_out + search.left_out,
        configs={r.model: r.text for r in recommendations},
    )
    return results, recommendations


def _folder(repository: Path | None, name: str) -> Path | None:
    if repository is None:
        return None
    try:
        return find_root([repository], name) / name
    except ConfigError:
        return None
