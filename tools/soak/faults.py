"""Faults while the load runs (kills, reloads, refused overrides), and SIGTERM at the end."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np

from tools.bench import servers
from tools.soak.outcomes import Outcomes, http_client
from tools.soak.repository import ADDER, CYCLE, HANG, MALFORMED_OVERRIDES
from tools.soak.traffic import request_body

EXIT_TIMEOUT_S = 3.0


async def _refused_override(http: httpx.AsyncClient, tally: Outcomes, fault: int) -> None:
    """A load override that must be refused (a cycle, a malformed config), harming nothing."""
    if fault == 3:
        model, config, why, label = "chain", CYCLE, "circular dependency", "cycle"
    else:
        fields = random.choice(MALFORMED_OVERRIDES)
        model, config, why, label = "adder", {"name": "adder", **fields}, "", "malformed"
    body = {"parameters": {"config": json.dumps(config)}}
    response = await http.post(f"/v2/repository/models/{model}/load", json=body)
    if response.status_code == 400 and why in response.text and "Traceback" not in response.text:
        tally.ok(f"fault: {label} override refused")
    else:
        tally.problem(
            f"fault: {label} override answered {response.status_code} {response.text[:120]}"
        )


async def faults(
    server: servers.Launched, root: Path, running: asyncio.Event, every: float, tally: Outcomes
) -> None:
    base = f"http://127.0.0.1:{server.port}"
    step = 0
    async with http_client(base) as http:
        while running.is_set():
            await asyncio.sleep(every)
            if not running.is_set():
                return
            fault = step % 5
            step += 1
            if fault == 0:
                pids = [
                    pid
                    for pid in servers.children_of(server.process.pid)
                    if runs(pid, b"reposerve.instance.worker")  # not a front process
                ]
                if pids:
                    os.kill(random.choice(pids), signal.SIGKILL)
                    tally.ok("fault: instance killed")
                continue
            if fault >= 3:
                await _refused_override(http, tally, fault)
                continue
            if fault == 1:
                (root / "adder" / "1" / "model.py").write_text(textwrap.dedent(ADDER))
                steps = [("load", "adder", "model reloaded")]
            else:
                steps = [("unload", "hangs", "model unloaded"), ("load", "hangs", "model loaded")]
            for action, model, done in steps:
                response = await http.post(f"/v2/repository/models/{model}/{action}")
                if response.status_code == 200:
                    tally.ok(f"fault: {done}")
                else:
                    tally.problem(f"fault: {action} {model} failed: {response.text[:120]}")


async def pending_gauges(http: httpx.AsyncClient) -> dict[str, float]:
    """The pending-request gauge of every model, from /metrics."""
    text = (await http.get("/metrics")).text
    gauges = {}
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{"):
            labels, value = line.rsplit(" ", 1)
            gauges[labels.split('model="', 1)[1].split('"', 1)[0]] = float(value)
    return gauges


async def sigterm_finale(
    server: servers.Launched, root: Path, metrics: httpx.AsyncClient, tally: Outcomes
) -> None:
    """Requests queued behind a hung execute, then SIGTERM: each gets a JSON error in time."""
    base = f"http://127.0.0.1:{server.port}"
    hung = np.zeros((1, 16), np.float32)
    hung[0, 0] = HANG
    async with http_client(base) as http:
        calls = [http.post("/v2/models/stuck/infer", json=request_body(hung))]
        sent = [asyncio.ensure_future(calls[0])]
        while not (root / "stuck" / "1" / "HANGING").exists():
            await asyncio.sleep(0.02)
        sent += [
            asyncio.ensure_future(http.post("/v2/models/stuck/infer", json=request_body(hung * 0)))
            for _ in range(3)
        ]
        while (await pending_gauges(metrics)).get("stuck", 0) < 3:
            await asyncio.sleep(0.02)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*sent, return_exceptions=True)
        code = await asyncio.to_thread(server.process.wait, 60)
        elapsed = time.monotonic() - started
    tally.sent += len(sent)
    for answer in answers:
        if isinstance(answer, BaseException):
            tally.problem(f"LOST: queued at SIGTERM, no answer ({type(answer).__name__})")
            continue
        tally.answered += 1
        if answer.status_code == 503 and "was unloaded before this request finished" in answer.text:
            tally.ok("queued at SIGTERM: JSON error in time")
        else:
            tally.problem(f"queued at SIGTERM: {answer.status_code} {answer.text[:120]}")
    if code != 0 or elapsed > EXIT_TIMEOUT_S + 3:
        tally.problem(f"SIGTERM: exit {code} after {elapsed:.1f} s (budget {EXIT_TIMEOUT_S:g} s)")
    else:
        tally.ok("SIGTERM: exit 0 within the budget")


def runs(pid: int, module: bytes) -> bool:
    try:
        return module in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return False
