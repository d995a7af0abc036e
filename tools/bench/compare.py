"""This checkout against another revision of reposerve, in one run.

Both serve the overhead workload (+1 on FP32[16], JSON) from a worktree each, beside the
bare Starlette echo on uvicorn; the three alternate in rounds, so each revision's ratio to
the echo is measured against the same machine moment and the two ratios can be compared
(absolute requests/s drift with a shared machine, a ratio to a run beside it much less).
An older revision may lack flags this one has: each side gets only the port flags its
``--help`` lists, and free ports for them, so the two never contend for Triton's.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from reposerve.tune.load import RunResult, closed_loop
from tools.bench import scenarios, servers
from tools.bench.scenarios import ECHO, HOST, Report
from tools.bench.wrk import wrk_loop

PORT_FLAGS = ("--grpc-port", "--metrics-port")


def port_flags(help_text: str) -> list[str]:
    """A free port for each of ``PORT_FLAGS`` that a revision's ``--help`` offers."""
    offered = set(re.findall(r"--[a-z-]+", help_text))
    flags: list[str] = []
    for flag in PORT_FLAGS:
        if flag in offered:
            flags += [flag, str(servers.free_port())]
    return flags


def _launch(label: str, tree: Path, repository: Path) -> servers.Launched:
    help_text = subprocess.run(
        [sys.executable, "-m", "reposerve", "--help"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    port = servers.free_port()
    command = [
        sys.executable, "-m", "reposerve", "--model-repository", str(repository),
        "--http-host", "127.0.0.1", "--http-port", str(port), "--log-level", "warning",
        *port_flags(help_text),
    ]  # fmt: skip
    return servers.Launched(label, command, port, "/v2/health/ready", tree=tree)


async def compare(
    base: str,
    duration: float,
    concurrencies: tuple[int, ...] = (1, 8, 32),
    rounds: int = 4,
    client: str = "python",
) -> Report:
    """``base`` (a git revision) and this checkout, interleaved with the bare echo;
    ``client``: the load generator, the Python closed loop or wrk (``tools.bench.wrk``)."""
    loop = wrk_loop if client == "wrk" else closed_loop
    payloads = scenarios._json_payloads("plus_one", 16)
    sides = (f"reposerve {base}", "reposerve this checkout")
    runs: dict[tuple[str, int], list[RunResult]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        worktree = root / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), base],
            cwd=servers.ROOT,
            check=True,
            capture_output=True,
        )
        try:
            scenarios._model(
                root / "repository", "plus_one", scenarios.PLUS_ONE_CONFIG, scenarios.PLUS_ONE
            )
            launched = [
                _launch(sides[0], worktree, root / "repository"),
                _launch(sides[1], servers.ROOT, root / "repository"),
            ]
            echo = servers.asgi(ECHO, "tools.bench.baselines:starlette_echo", "uvicorn")
            try:
                for _ in range(rounds):
                    for concurrency in concurrencies:
                        bare = await loop(ECHO, HOST, echo.port, payloads, concurrency, duration)
                        runs.setdefault((ECHO, concurrency), []).append(bare)
                        for server in launched:
                            result = await loop(
                                server.label, HOST, server.port, payloads, concurrency, duration
                            )
                            runs.setdefault((server.label, concurrency), []).append(result)
                            ratios.setdefault((server.label, concurrency), []).append(
                                result.throughput / bare.throughput
                            )
            finally:
                for server in (*launched, echo):
                    server.stop()
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(worktree)],
                cwd=servers.ROOT,
                check=False,
                capture_output=True,
            )
    facts: dict[str, float] = {}
    for concurrency in concurrencies:
        medians = [statistics.median(ratios[(side, concurrency)]) for side in sides]
        for side, median in zip(sides, medians, strict=True):
            facts[f"c={concurrency} {side} / starlette echo throughput"] = median
        facts[f"c={concurrency} this checkout / {base}, each as a share of the echo"] = (
            medians[1] / medians[0]
        )
    results = [scenarios.median_run(found) for found in runs.values()]
    return Report(f"compare with {base} ({client} client)", results, facts)
