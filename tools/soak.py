"""Soak: a real server under mixed load, faults and hostile input, for a while.

    python -m tools.soak [--duration 60] [--concurrency 8] [--fault-every 3]

Clients send good requests (each checked against its exact answer) and malformed ones
(each must get a 4xx), while a fault loop alternately SIGKILLs an instance process and
reloads the model from disk. It passes when every good request was answered correctly or
failed only with the error its fault explains (an instance killed under it, or 503 while
the replacement starts), every bad request got a 4xx, the front's memory stayed flat,
and no instance process outlived the server. Exit status 0 on a pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from tools.bench import servers

ADDER = """
    import numpy as np

    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 1}
"""
CONFIG = """
    max_batch_size = 8
    [[input]]
    name = "INPUT"
    datatype = "FP32"
    shape = [16]
    [[output]]
    name = "OUTPUT"
    datatype = "FP32"
    shape = [16]
    [[instance_group]]
    count = 2
    [dynamic_batching]
    max_queue_delay_microseconds = 500
"""
BAD_BODIES = [
    b"{",
    b'{"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "FP32", "data": [1]}]}',
    b'{"inputs": [{"name": "NOPE", "shape": [1, 16], "datatype": "FP32", "data": []}]}',
    b'{"inputs": [{"name": "INPUT", "shape": [1, 99999999999], "datatype": "FP32", "data": [1]}]}',
    b'{"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "INT8", "data": [1]}]}',
    b'{"inputs": "x"}',
]
MEMORY_GROWTH_MIB = 20.0  # allowed growth of the front after the first quarter of the run
# Errors a fault explains: the instance died under the request, or it is being replaced.
EXPLAINED = ("was killed by SIGKILL", "retry shortly", "every instance died", "is unloading")


class Outcomes:
    """What happened: ``seen`` counts every outcome, ``problems`` only those that fail the soak."""

    def __init__(self) -> None:
        self.seen: Counter = Counter()
        self.problems: Counter = Counter()

    def ok(self, outcome: str) -> None:
        self.seen[outcome] += 1

    def problem(self, outcome: str) -> None:
        self.seen[outcome] += 1
        self.problems[outcome] += 1


async def _client(base: str, stop: float, tally: Outcomes, seed: int) -> None:
    rng = np.random.default_rng(seed)
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        while time.monotonic() < stop:
            if rng.random() < 0.2:
                body = BAD_BODIES[int(rng.integers(len(BAD_BODIES)))]
                response = await http.post("/v2/models/adder/infer", content=body)
                if 400 <= response.status_code < 500:
                    tally.ok("bad request answered 4xx")
                else:
                    tally.problem(f"bad request answered {response.status_code}")
                continue
            batch = int(rng.integers(1, 4))
            values = rng.standard_normal((batch, 16)).astype(np.float32)
            tensor = {"name": "INPUT", "shape": [batch, 16], "datatype": "FP32"}
            request = {"inputs": [{**tensor, "data": values.ravel().tolist()}]}
            response = await http.post("/v2/models/adder/infer", json=request)
            if response.status_code == 200:
                data = np.array(response.json()["outputs"][0]["data"], np.float32).reshape(
                    batch, 16
                )
                if np.array_equal(data, values + 1):
                    tally.ok("good request answered correctly")
                else:
                    tally.problem("good request answered WRONG")
            elif any(reason in response.text for reason in EXPLAINED):
                tally.ok("good request failed by a fault")
            else:
                tally.problem(f"good request failed: {response.status_code} {response.text[:120]}")


async def _faults(
    server: servers.Launched, root: Path, stop: float, every: float, tally: Outcomes
) -> None:
    base = f"http://127.0.0.1:{server.port}"
    kill = True
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        while time.monotonic() + every < stop:
            await asyncio.sleep(every)
            if kill:
                pids = servers.children_of(server.process.pid)
                if pids:
                    os.kill(random.choice(pids), signal.SIGKILL)
                    tally.ok("fault: instance killed")
            else:
                (root / "adder" / "1" / "model.py").write_text(textwrap.dedent(ADDER))
                response = await http.post("/v2/repository/models/adder/load")
                if response.status_code == 200:
                    tally.ok("fault: model reloaded")
                else:
                    tally.problem(f"fault: reload failed: {response.text[:120]}")
            kill = not kill


async def _memory(server: servers.Launched, stop: float, samples: list[float]) -> None:
    while time.monotonic() < stop:
        samples.append(servers.pss_mib(server.process.pid))
        await asyncio.sleep(0.5)


async def soak(duration: float, concurrency: int, fault_every: float) -> bool:
    tally = Outcomes()
    memory: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "adder" / "1").mkdir(parents=True)
        (root / "adder" / "config.toml").write_text(textwrap.dedent(CONFIG))
        (root / "adder" / "1" / "model.py").write_text(textwrap.dedent(ADDER))
        server = servers.reposerve(root)
        stop = time.monotonic() + duration
        try:
            base = f"http://127.0.0.1:{server.port}"
            await asyncio.gather(
                *(_client(base, stop, tally, seed) for seed in range(concurrency)),
                _faults(server, root, stop, fault_every, tally),
                _memory(server, stop, memory),
            )
        finally:
            instances = servers.children_of(server.process.pid)
            server.stop()
    orphans = [pid for pid in instances if Path(f"/proc/{pid}").exists()]
    for outcome, count in sorted(tally.seen.items()):
        print(f"{count:8d}  {outcome}")
    settled = memory[len(memory) // 4 :] or memory
    growth = settled[-1] - settled[0] if settled else 0.0
    print(f"front memory (PSS): {settled[0]:.1f} -> {settled[-1]:.1f} MiB; orphans: {len(orphans)}")
    answered = tally.seen["good request answered correctly"]
    passed = not tally.problems and answered > 0 and growth < MEMORY_GROWTH_MIB and not orphans
    print("soak: PASS" if passed else "soak: FAIL")
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (60)")
    parser.add_argument("--concurrency", type=int, default=8, help="clients (8)")
    parser.add_argument("--fault-every", type=float, default=3.0, help="seconds between faults (3)")
    args = parser.parse_args()
    return 0 if asyncio.run(soak(args.duration, args.concurrency, args.fault_every)) else 1


if __name__ == "__main__":
    sys.exit(main())
