"""Phase 4, faults: out of device memory fails one request and the same instance serves the
next; a device-side assert fails its request with "being replaced" and 20 requests after it
succeed; SIGKILL of an instance holding 20 GiB (CPU: 1.5 GiB of RAM) while
``/v2/health/live`` is polled every 10 ms. Only the SIGKILL part runs without a GPU."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tools.gpu_check.context import Run, Server
from tools.gpu_check.models import (
    ASSERT,
    FAULTS,
    FAULTS_CONFIG,
    OOM,
    PROBE,
    PROBE_CONFIG,
    groups,
    instance_facts,
    write_model,
)
from tools.gpu_check.node import process_gone
from tools.gpu_check.report import Phase, percentile_ms


class HealthPoller:
    """``GET /v2/health/live`` every 10 ms from a thread; the latency of each."""

    def __init__(self, url: str) -> None:
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self._url, timeout=5) as http:
            while not self._stop.wait(0.01):
                started = time.perf_counter()
                try:
                    status = http.get("/v2/health/live").status_code
                except httpx.HTTPError as exc:
                    status = f"{type(exc).__name__}"
                self.latencies.append(time.perf_counter() - started)
                if status != 200:
                    self.errors.append(str(status))

    @contextmanager
    def running(self) -> Iterator[None]:
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join(10)


def faults(run: Run, phase: Phase) -> None:
    node = run.node
    if run.gpu_unusable(phase, "faults on the GPU"):
        return
    root = run.repository("faults")
    on_gpu = run.gpu_ready(phase, "out of memory")
    if on_gpu:
        write_model(root, "fault_oom", FAULTS_CONFIG + groups("gpu", 1, [0]), FAULTS)
        write_model(root, "fault_assert", FAULTS_CONFIG + groups("gpu", 2, [0]), FAULTS)
        hold_gib = round(min(20.0, node.gpus[0].memory_total_mib / 1024 * 0.4), 1)
        where = groups("gpu", 1, [0])
    else:
        phase.skip_part("device assert", node.no_gpu_reason)
        hold_gib = 1.5
        where = groups("cpu", 1)
    big = write_model(
        root, "big", PROBE_CONFIG + where + f"[parameters]\nhold_gib = {hold_gib}\n", PROBE
    )
    server = run.serve("faults", root)
    if on_gpu:
        _out_of_memory(server, phase)
        _device_assert(server, phase, root / "fault_assert" / "1")

    # SIGKILL of an instance holding a lot of memory: the front keeps answering at once
    # (its teardown is off the event loop) and the model comes back.
    old = instance_facts(big)[-1]["pid"]
    poller = HealthPoller(server.url)
    with poller.running():
        time.sleep(1.0)
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        back_s = None
        while time.monotonic() - killed < 120:
            pids = [fact["pid"] for fact in instance_facts(big)]
            if pids[-1] != old and server.http.get("/v2/models/big/ready").status_code == 200:
                back_s = round(time.monotonic() - killed, 2)
                break
            time.sleep(0.05)
        time.sleep(1.0)
    worst = percentile_ms(poller.latencies, 100)
    phase.facts["sigkill"] = {
        "held_gib": hold_gib,
        "device": "gpu" if on_gpu else "cpu",
        "health_polls": len(poller.latencies),
        "health_p50_ms": percentile_ms(poller.latencies, 50),
        "health_p99_ms": percentile_ms(poller.latencies, 99),
        "health_worst_ms": worst,
        "health_errors": poller.errors[:10],
        "back_ready_s": back_s,
    }
    phase.check(
        f"SIGKILL of a {hold_gib:g} GiB instance: /v2/health/live stays fast",
        worst < 1000 and not poller.errors,
        f"worst {worst} ms over {len(poller.latencies)} polls, errors {poller.errors[:3]}",
    )
    phase.check("the killed instance's model is ready again", back_s is not None, f"{back_s} s")
    phase.check("the killed process is gone", process_gone(old), f"pid {old}")
    phase.headline = f"SIGKILL {hold_gib:g} GiB: health worst {worst} ms, back in {back_s} s" + (
        f"; {phase.facts['out_of_memory']['summary']}; {phase.facts['device_assert']['summary']}"
        if on_gpu
        else ""
    )


def _out_of_memory(server: Server, phase: Phase) -> None:
    def pid() -> int | None:
        answer = server.infer_flag("fault_oom", 0)
        return answer.json()["outputs"][0]["data"][0] if answer.status_code == 200 else None

    before = pid()
    failed = server.infer_flag("fault_oom", OOM)
    after = pid()
    phase.facts["out_of_memory"] = {
        "pid_before": before,
        "status": failed.status_code,
        "error": failed.text[:500],
        "pid_after": after,
        "summary": f"OOM -> {failed.status_code}, then pid {'same' if after == before else after}",
    }
    phase.check(
        "out of memory: that request gets a 500 saying so",
        failed.status_code == 500 and "out of memory" in failed.text.lower(),
        f"{failed.status_code} {failed.text[:300]}",
    )
    phase.check(
        "out of memory: the next request succeeds on the same instance",
        before is not None and after == before,
        f"pid before {before}, after {after}",
    )


def _device_assert(server: Server, phase: Phase, version: Path) -> None:
    before = {fact["pid"] for fact in instance_facts(version)}
    failed = server.infer_flag("fault_assert", ASSERT)
    marker = version / "instances" / "asserted.txt"
    asserted = int(marker.read_text()) if marker.exists() else -1  # -1: it never ran
    answers = [server.infer_flag("fault_assert", 0) for _ in range(20)]
    good = [answer for answer in answers if answer.status_code == 200]
    served_by = Counter(answer.json()["outputs"][0]["data"][0] for answer in good)
    started = time.monotonic()
    replacement: set[int] = set()
    while time.monotonic() - started < 60:
        replacement = {fact["pid"] for fact in instance_facts(version)} - before
        if replacement and process_gone(asserted):
            break
        time.sleep(0.1)
    phase.facts["device_assert"] = {
        "status": failed.status_code,
        "error": failed.text[:500],
        "asserted_pid": asserted,
        "after": [answer.status_code for answer in answers],
        "served_by": dict(served_by),
        "replacement_pids": sorted(replacement),
        "summary": f"assert -> {failed.status_code}, then {len(good)}/20 served",
    }
    phase.check(
        "device assert: a 500 saying the instance is being replaced",
        failed.status_code == 500 and "being replaced" in failed.text,
        f"{failed.status_code} {failed.text[:300]}",
    )
    phase.check(
        "device assert: the 20 requests after it succeed",
        len(good) == 20 and asserted not in served_by,
        f"{[answer.status_code for answer in answers]}, served by {dict(served_by)}",
    )
    phase.check(
        "device assert: the instance ends and a replacement loads",
        bool(replacement) and asserted > 0 and process_gone(asserted),
        f"asserted pid {asserted} gone: {process_gone(asserted)}, new {sorted(replacement)}",
    )
