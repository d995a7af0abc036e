"""The ``many-models`` scenario: more models than memory, loaded on demand under a budget.

30 python models that each hold 200 MiB once loaded (their weights, written so they are
resident), served with ``--model-control-mode on-demand --host-memory-budget 1.5G``: about
six fit at once. Requests come at a fixed rate (an open loop: latency counts from each
request's scheduled time), each for a model drawn from a Zipf distribution (s = 1.1, a few
models take most requests, the tail comes and goes). Reported:

- errors (every request must be answered: the budget makes room, never refuses)
- the hit ratio (requests whose model was resident when sent) and the p50/p99 of those
  that found it resident (warm) and of those that waited for its load (cold)
- the largest resident total seen (the instances' PSS, sampled every 0.25 s) against the
  budget and the budget plus one model, loads and evictions
"""

from __future__ import annotations

import asyncio
import random
import re
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np

from reposerve.tune.load import RunResult
from tools.bench import servers
from tools.bench.scenarios import Report, vector_config

MODELS = 30
HOLDS_MIB = 200
BUDGET = "1.5G"
BUDGET_MIB = 1.5 * 1024
RATE = 10.0  # requests per second
ZIPF_S = 1.1
CODE = f"""
    import numpy as np

    class Model:
        def load(self, context):
            self.weights = np.ones({HOLDS_MIB} << 20, np.uint8)

        def execute(self, inputs):
            return {{"OUTPUT": inputs["INPUT"] + 1}}
"""
BODY = {"inputs": [{"name": "INPUT", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}


def _repository(root: Path) -> list[str]:
    names = [f"model_{index:02d}" for index in range(MODELS)]
    for name in names:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.toml").write_text(textwrap.dedent(vector_config(4, 8, False)))
        (root / name / "1" / "model.py").write_text(textwrap.dedent(CODE))
    return names


def _zipf(names: list[str], count: int, seed: int = 7) -> list[str]:
    weights = [1 / (rank**ZIPF_S) for rank in range(1, len(names) + 1)]
    return random.Random(seed).choices(names, weights, k=count)


async def _resident_models(client: httpx.AsyncClient) -> set[str]:
    entries = (await client.post("/v2/repository/index", json={"ready": True})).json()
    return {entry["name"] for entry in entries}


async def many_models(duration: float) -> Report:
    duration = max(duration, 60.0)  # loads take seconds: a short run measures start-up
    with tempfile.TemporaryDirectory(prefix="many-models-") as folder:
        names = _repository(Path(folder))
        flags = (
            "--model-control-mode", "on-demand", "--host-memory-budget", BUDGET,
            "--allow-metrics", "true", "--metrics-port", str(servers.free_port()),
        )  # fmt: skip
        server = servers.reposerve(Path(folder), *flags, log_path=Path(folder) / "server.log")
        try:
            return await _run(server, names, duration, flags[-1])
        finally:
            server.stop()


async def _run(server: servers.Launched, names: list[str], duration: float, metrics: str) -> Report:
    url = f"http://127.0.0.1:{server.port}"
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        resident: set[str] = set()
        peak_mib = 0.0
        done = asyncio.Event()

        async def watch() -> None:
            nonlocal resident, peak_mib
            while not done.is_set():
                resident = await _resident_models(client)
                workers = servers.children_of(server.process.pid)
                peak_mib = max(peak_mib, sum(servers.pss_mib(pid) for pid in workers))
                await asyncio.sleep(0.25)

        samples: list[tuple[bool, float, bool]] = []  # (warm, latency s, answered)
        order = _zipf(names, int(RATE * duration))
        start = time.perf_counter() + 0.1

        async def one(index: int, model: str) -> None:
            await asyncio.sleep(max(start + index / RATE - time.perf_counter(), 0))
            scheduled = start + index / RATE
            warm = model in resident
            try:
                answer = await client.post(f"/v2/models/{model}/infer", json=BODY)
                ok = answer.status_code == 200
            except httpx.HTTPError:
                ok = False
            samples.append((warm, time.perf_counter() - scheduled, ok))

        watcher = asyncio.ensure_future(watch())
        await asyncio.gather(*(one(index, model) for index, model in enumerate(order)))
        done.set()
        await watcher
        text = httpx.get(f"http://127.0.0.1:{metrics}/metrics").text
    return _report(samples, duration, peak_mib, text)


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found[1]) if found else 0.0


def _result(label: str, picked: list[tuple[bool, float, bool]], duration: float) -> RunResult:
    latencies = np.array([latency for _, latency, ok in picked if ok] or [0.0]) * 1000
    return RunResult(
        label=label,
        mode="open",
        concurrency=0,
        rate=len(picked) / duration,
        duration_s=duration,
        completed=sum(ok for _, _, ok in picked),
        errors=sum(not ok for _, _, ok in picked),
        throughput=sum(ok for _, _, ok in picked) / duration,
        p50_ms=float(np.percentile(latencies, 50)),
        p90_ms=float(np.percentile(latencies, 90)),
        p99_ms=float(np.percentile(latencies, 99)),
        max_ms=float(latencies.max()),
        latency_slope_ms_per_s=0.0,
    )


def _report(
    samples: list[tuple[bool, float, bool]], duration: float, peak_mib: float, metrics: str
) -> Report:
    warm = [sample for sample in samples if sample[0]]
    cold = [sample for sample in samples if not sample[0]]
    footprints = re.findall(r"^reposerve_model_resident_bytes\{.*\} (\S+)$", metrics, re.MULTILINE)
    model_mib = max((float(value) for value in footprints), default=0.0) / (1 << 20)
    return Report(
        "many-models",
        [
            _result("warm (model resident)", warm, duration),
            _result("cold (waits for a load)", cold, duration),
        ],
        facts={
            "requests": len(samples),
            "errors": sum(not ok for _, _, ok in samples),
            "hit_ratio": len(warm) / max(len(samples), 1),
            "loads": _metric(metrics, "reposerve_model_loads_total"),
            "evictions": _metric(metrics, "reposerve_model_evictions_total"),
            "peak_resident_mib": peak_mib,
            "budget_mib": BUDGET_MIB,
            "budget_plus_one_model_mib": BUDGET_MIB + model_mib,
        },
    )
