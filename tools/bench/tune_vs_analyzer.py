"""``python -m tools.bench tune-vs-analyzer``: ``reposerve tune`` against Triton's Model
Analyzer on the same model, machine and p99 budget.

Each tool searches on its own (tune with its default time budget; Model Analyzer's automatic
brute search over instances and max batch size with dynamic batching, in its remote mode
against a reposerve server, bounded below its defaults so that it ends within an hour here).
Model Analyzer is told ``cpu_only``: in remote mode it cannot see that the host has no GPU,
and without it every candidate it makes asks for KIND_GPU and fails to load.
Then the winner of each, and the shipped configuration, are loaded in turn on one server
and measured by the same client, perf_analyzer, at the concurrency each tool chose, in
interleaved rounds: the comparison does not rest on either tool's own numbers.
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reposerve.config import parse_model_config
from reposerve.config.pbtxt import parse_pbtxt
from reposerve.config.triton import to_triton
from reposerve.tune.client import ServerClient
from reposerve.tune.load import RunResult
from tools.bench.protocols import ANALYZER_REMOTE_MODE, analyzer_environment, perf_analyzer_run
from tools.bench.scenarios import Report
from tools.bench.servers import ROOT, free_port, reposerve

MODEL = "resnet50_onnx"
P99_BUDGET_MS = 1000.0
ROUNDS = 3
ANALYZER = ROOT / ".venv-analyzer" / "bin" / "model-analyzer"
# The fields a candidate changes; the rest of the served config stays as it is.
TUNED_FIELDS = ("max_batch_size", "dynamic_batching", "instance_group", "parameters")

ANALYZER_CONFIG = (
    ANALYZER_REMOTE_MODE
    + """\
run_config_search_max_instance_count: 3
run_config_search_max_model_batch_size: 32
run_config_search_max_concurrency: 64
perf_analyzer_flags:
  measurement-interval: 2000
profile_models:
  {model}:
    cpu_only: true
    constraints:
      perf_latency_p99:
        max: {budget}
"""
)


async def tune_vs_analyzer(duration: float) -> Report:
    work = Path(tempfile.mkdtemp(prefix="tune-vs-analyzer-"))
    source = ROOT / "model_repository" / MODEL
    if not source.is_dir():
        raise SystemExit(f"{source} is missing: run python tools/export_examples.py first")
    repository = work / "repository"
    shutil.copytree(source, repository / MODEL)
    facts: dict[str, float] = {"p99_budget_ms": P99_BUDGET_MS}

    started = time.monotonic()
    tune_out = work / "tune"
    subprocess.run(
        [sys.executable, "-m", "reposerve", "tune", MODEL, "--model-repository",
         str(repository), "--p99-ms", str(P99_BUDGET_MS), "--out", str(tune_out)],
        check=True,
    )  # fmt: skip
    facts["tune_wall_s"] = time.monotonic() - started
    tuned = json.loads((tune_out / "results.json").read_text())
    facts["tune_own_best"] = tuned["best"]["score"]
    # What tune recommends: its best only when that won the A/B, else the shipped config.
    won = tuned["ab"] is not None and tuned["ab"]["tuned_wins"]
    tune_concurrency = tuned["best" if won else "baseline"]["concurrency"]

    started = time.monotonic()
    analyzer_config, analyzer_concurrency, analyzer_best = _run_analyzer(repository, work)
    facts["analyzer_wall_s"] = time.monotonic() - started
    facts["analyzer_own_best"] = analyzer_best

    server = reposerve(repository, "--load-model", MODEL, "--model-control-mode", "explicit")
    results: list[RunResult] = []
    try:
        client = ServerClient(f"127.0.0.1:{server.port}")
        served = client.config(MODEL)
        candidates = [
            ("shipped", served, tuned["baseline"]["concurrency"]),
            ("reposerve tune", _merged(served, tune_out / "config.toml"), tune_concurrency),
            ("Model Analyzer", _merged(served, analyzer_config), analyzer_concurrency),
        ]
        for _ in range(ROUNDS):
            for label, document, concurrency in candidates:
                client.load(MODEL, document)
                run = await perf_analyzer_run(
                    f"{label} c={concurrency}", "http", client.address, MODEL, concurrency,
                    duration,
                )  # fmt: skip
                if run is None:
                    raise SystemExit(
                        "perf_analyzer did not run: see tools/install_perf_analyzer.sh"
                    )
                print(run.line(), flush=True)
                results.append(run)
    finally:
        server.stop()
    for label, _, _ in candidates:
        runs = [r for r in results if r.label.startswith(label)]
        facts[f"{label} median req/s"] = statistics.median(r.throughput for r in runs)
        facts[f"{label} median p99 ms"] = statistics.median(r.p99_ms for r in runs)
    facts["tune / analyzer"] = (
        facts["reposerve tune median req/s"] / facts["Model Analyzer median req/s"]
    )
    print(f"work folder (reports of both tools): {work}")
    return Report("tune-vs-analyzer", results, facts)


def _run_analyzer(repository: Path, work: Path) -> tuple[Path, int, float]:
    """Model Analyzer's search on a reposerve server: the winning variant's config file,
    its concurrency, and its own measured requests/s, best within the p99 budget."""
    if not ANALYZER.exists():
        raise SystemExit(f"{ANALYZER} is missing: run tools/install_model_analyzer.sh")
    out = work / "analyzer"
    out.mkdir()
    metrics_port = free_port()
    server = reposerve(
        repository, "--allow-metrics", "true", "--metrics-port", str(metrics_port),
        "--load-model", MODEL, "--model-control-mode", "explicit",
    )  # fmt: skip
    try:
        config = work / "analyzer.yaml"
        config.write_text(
            ANALYZER_CONFIG.format(
                repository=repository, address=f"127.0.0.1:{server.port}",
                metrics_port=metrics_port, out=out, model=MODEL, budget=int(P99_BUDGET_MS),
            )
        )  # fmt: skip
        env = analyzer_environment()
        subprocess.run([str(ANALYZER), "profile", "-f", str(config)], check=True, env=env, cwd=work)
    finally:
        server.stop()
    with open(out / "export" / "results" / "metrics-model-inference.csv") as file:
        rows = [
            row for row in csv.DictReader(file) if float(row["p99 Latency (ms)"]) <= P99_BUDGET_MS
        ]
    best = max(rows, key=lambda row: float(row["Throughput (infer/sec)"]))
    variant = best["Model Config Path"]
    path = out / "variants" / variant / "config.pbtxt"
    return path, int(best["Concurrency"]), float(best["Throughput (infer/sec)"])


def _merged(served: dict, config_path: Path) -> dict:
    """The served config with the tuned fields of ``config_path``'s configuration."""
    text = config_path.read_text()
    if config_path.suffix == ".pbtxt":  # its folder is the variant's, named otherwise
        config = parse_pbtxt(text, str(config_path))
    else:
        config = parse_model_config(text, str(config_path))
    variant = to_triton(MODEL, "onnxruntime", config)
    merged = dict(served)
    for field in TUNED_FIELDS:
        if field in variant:
            merged[field] = variant[field]
        elif field == "dynamic_batching":
            merged.pop(field, None)
    if not variant["instance_group"]:
        merged["instance_group"] = served["instance_group"]
    return merged
