"""Front processes: the same server at 1, 2 and 4 fronts per protocol (--http-workers,
--grpc-workers), in interleaved rounds of one run, each reported as a ratio to 1 front.

Workloads: the overhead one (+1 on FP32[16]) over HTTP JSON and HTTP binary (our lean
generator) and over gRPC and HTTP by perf_analyzer (one C++ client for both protocols);
and a ResNet-sized request (a ~150 KB JPEG as BYTES, answered with FP32[1000] logits)
over HTTP binary, which measures what a large body costs on its way through a front.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from reposerve.tune.load import RunResult, closed_loop
from tools.bench import servers
from tools.bench.protocols import perf_analyzer_run
from tools.bench.scenarios import (
    HOST,
    PLUS_ONE,
    PLUS_ONE_CONFIG,
    Report,
    _binary_payloads,
    _jpeg_payloads,
    _json_payloads,
    _model,
    median_run,
)

WORKERS = (1, 2, 4)
LOGITS_CONFIG = """
    max_batch_size = 16
    [[input]]
    name = "IMAGE"
    datatype = "BYTES"
    shape = [1]
    [[output]]
    name = "LOGITS"
    datatype = "FP32"
    shape = [1000]
    [dynamic_batching]
"""
# Stands in for ResNet-50 after its request is decoded: the model's own time is not what
# this measures, the 150 KB on its way in is.
LOGITS = """
    import numpy as np

    class Model:
        def execute(self, inputs):
            images = inputs["IMAGE"]
            logits = np.zeros((len(images), 1000), np.float32)
            logits[:, 0] = [len(image[0]) for image in images]
            return {"LOGITS": logits}
"""


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def _busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    return (after[0] - before[0]) / max(after[1] - before[1], 1)


async def fronts(
    duration: float,
    concurrencies: tuple[int, ...] = (1, 32),
    workers: tuple[int, ...] = WORKERS,
    rounds: int = 3,
) -> Report:
    runs: dict[tuple[str, int, int], list[RunResult]] = {}
    busy: dict[tuple[str, int, int], list[float]] = {}  # the machine's CPU, all cores
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _model(root, "plus_one", PLUS_ONE_CONFIG, PLUS_ONE)
        _model(root, "logits", LOGITS_CONFIG, LOGITS)
        workloads = {
            "http json": _json_payloads("plus_one", 16),
            "http binary": _binary_payloads("plus_one", 16),
            "jpeg 150 KB binary": _jpeg_payloads("logits", "LOGITS"),
        }
        launched = {}
        try:
            for count in workers:
                grpc_port = servers.free_port()
                flags = ["--http-workers", str(count), "--grpc-workers", str(count)]
                server = servers.reposerve(root, *flags, "--grpc-port", str(grpc_port))
                launched[count] = (server, grpc_port)
            for _ in range(rounds):
                for concurrency in concurrencies:
                    for count, (server, grpc_port) in launched.items():
                        label = f"{count} front{'s' if count > 1 else ''}"
                        for name, payloads in workloads.items():
                            before = _cpu_times()
                            result = await closed_loop(
                                f"{label} {name}", HOST, server.port, payloads, concurrency,
                                duration,
                            )  # fmt: skip
                            key = (name, count, concurrency)
                            runs.setdefault(key, []).append(result)
                            busy.setdefault(key, []).append(_busy_share(before, _cpu_times()))
                        for protocol, port in (("grpc", grpc_port), ("http", server.port)):
                            before = _cpu_times()
                            analyzed = await perf_analyzer_run(
                                f"{label} {protocol} (perf_analyzer)", protocol,
                                f"{HOST}:{port}", "plus_one", concurrency, duration,
                            )  # fmt: skip
                            if analyzed is not None:
                                key = (f"{protocol} (perf_analyzer)", count, concurrency)
                                runs.setdefault(key, []).append(analyzed)
                                share = _busy_share(before, _cpu_times())
                                busy.setdefault(key, []).append(share)
        finally:
            for server, _ in launched.values():
                server.stop()
    results = [median_run(found) for found in runs.values()]
    facts: dict[str, float] = {}
    for (name, count, concurrency), found in runs.items():
        one = runs.get((name, 1, concurrency))
        if count == 1 or not one:
            continue
        ratio = statistics.median(r.throughput for r in found) / statistics.median(
            r.throughput for r in one
        )
        facts[f"c={concurrency} {name}: {count} fronts / 1 front throughput"] = ratio
    for (name, count, concurrency), shares in busy.items():
        facts[f"c={concurrency} {name}: {count} front(s), machine CPU busy"] = statistics.median(
            shares
        )
    for (name, count, concurrency), found in runs.items():
        if concurrency == 1:
            facts[f"c=1 {name}: {count} front(s) p50 (ms)"] = median_run(found).p50_ms
    return Report("fronts", results, facts)


async def grpc_servers(duration: float, concurrency: int = 32, rounds: int = 4) -> Report:
    """What one gRPC call costs: reposerve's gRPC front against the bare ceiling of
    grpcio (``tools.bench.grpc_baseline``: the same protocol, +1 in-process, nothing else)
    on its asyncio server, which reposerve uses, and on its thread-pool server;
    perf_analyzer drives all three in interleaved rounds."""
    runs: dict[str, list[RunResult]] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _model(root, "plus_one", PLUS_ONE_CONFIG, PLUS_ONE)
        grpc_port = servers.free_port()
        launched = {
            "reposerve grpc": (servers.reposerve(root, "--grpc-port", str(grpc_port)), grpc_port)
        }
        for mode in ("aio", "threads"):
            port = servers.free_port()
            command = [sys.executable, "-m", "tools.bench.grpc_baseline", mode, str(port)]
            launched[f"bare grpcio {mode}"] = (servers.Launched(mode, command, port, None), port)
        try:
            for _ in range(rounds):
                for label, (_, port) in launched.items():
                    result = await perf_analyzer_run(
                        label, "grpc", f"{HOST}:{port}", "plus_one", concurrency, duration
                    )
                    if result is not None:
                        runs.setdefault(label, []).append(result)
        finally:
            for server, _ in launched.values():
                server.stop()
    medians = {
        label: statistics.median(r.throughput for r in found) for label, found in runs.items()
    }
    facts = {}
    if "bare grpcio aio" in medians:
        for label, value in medians.items():
            facts[f"c={concurrency} {label} / bare grpcio aio throughput"] = (
                value / medians["bare grpcio aio"]
            )
    return Report("grpc-servers", [median_run(found) for found in runs.values()], facts)
