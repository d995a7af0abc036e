"""Phase 3, throughput (GPU): ResNet-50 bf16 images/s through the server against pure torch
on the same GPU, batch 16 and 32, one and two instances (goal: >= 0.9x), and the latency of
the first requests to a model loaded warm. ``--cpu-smoke`` runs a tiny CPU version."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import numpy as np

from reposerve.tune import load as loadgen
from reposerve.tune.requests import binary_request
from tools.gpu_check.context import Run, Server, explicit
from tools.gpu_check.models import (
    autocast,
    export_program,
    groups,
    image_config,
    image_request,
    load_program,
    write_model,
)
from tools.gpu_check.node import utilization_pct
from tools.gpu_check.report import Phase, percentile_ms


class Plan(msgspec.Struct, frozen=True):
    """What the throughput phase measures: the real thing on a GPU, a smoke run on a CPU."""

    arch: str
    device: str  # "cuda" | "cpu"
    precision: str  # bf16 on a GPU; fp32 on a CPU, where bf16 without bf16 units is slow
    batches: tuple[int, ...]
    counts: tuple[int, ...]  # instances per configuration
    concurrency_per_instance: int
    seconds: float  # each measurement, after its warmup
    warmup_s: float
    first_requests: int


class GpuSampler:
    """nvidia-smi's utilization.gpu sampled every half second while a measurement runs."""

    def __init__(self, uuid: str | None) -> None:
        self.samples: list[int] = []
        self._uuid = uuid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                sample = utilization_pct(self._uuid)
                if sample is not None:
                    self.samples.append(sample)
            except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired):
                return

    @contextmanager
    def running(self) -> Iterator[None]:
        if self._uuid is not None:
            self._thread.start()
        try:
            yield
        finally:
            self._stop.set()

    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None


def pure_images_per_s(
    module: Any, device: str, precision: str, batch: int, seconds: float
) -> dict[str, float]:
    """ResNet images/s of the module alone under the backend's autocast: the input already
    on the device (the bound), and with the copies a server pays (host input in, logits
    back)."""
    import torch

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    on_device = torch.randn(batch, 3, 224, 224, device=device)
    host = torch.randn(batch, 3, 224, 224)
    if device == "cuda":
        host = host.pin_memory()
    found = {}
    with torch.inference_mode(), autocast(device, precision):
        for label, step in (
            ("on_device", lambda: module(on_device)),
            ("with_copies", lambda: module(host.to(device, non_blocking=True)).float().cpu()),
        ):
            for _ in range(5):
                step()
            synchronize()
            started, runs = time.perf_counter(), 0
            while time.perf_counter() - started < seconds:
                step()
                runs += 1
            synchronize()  # kernels queued inside the window finish before it closes
            found[label] = round(runs * batch / (time.perf_counter() - started), 1)
    return found


def throughput(run: Run, phase: Phase) -> None:
    import torch

    node = run.node
    seconds = run.args.seconds
    if node.gpus or not run.args.cpu_smoke:
        if not run.gpu_ready(phase, "throughput"):
            phase.skipped = (
                f"{node.no_gpu_reason} (ResNet-50 images/s against pure torch means something "
                "on a GPU only; --cpu-smoke runs a tiny CPU version)"
            )
            return
        plan = Plan("resnet50", "cuda", "bf16", (16, 32), (1, 2), 8, seconds, 2.0, 50)
    else:
        plan = Plan("resnet18", "cpu", "fp32", (2, 4), (1, 2), 1, min(seconds, 3.0), 1.0, 20)
        phase.facts["note"] = "--cpu-smoke: a CPU run of the code path; its numbers mean little"
    phase.facts["plan"] = msgspec.to_builtins(plan)
    program = run.workdir / "exports" / f"{plan.arch}.pt2"
    with phase.timed("export"):
        export_program(plan.arch, program)

    # Pure torch first, then free the device for the server.
    torch.backends.cudnn.benchmark = True  # as the served models ask (cudnn_benchmark)
    with phase.timed("pure torch"):
        module = load_program(program, plan.device)
        pure = {
            batch: pure_images_per_s(module, plan.device, plan.precision, batch, plan.seconds / 2)
            for batch in plan.batches
        }
    del module
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    phase.facts["pure_torch_images_per_s"] = pure

    root = run.repository("throughput")
    largest = max(plan.batches)
    placed = "gpu" if plan.device == "cuda" else "cpu"
    preferred = list(plan.batches)
    for name, count in [(f"{plan.arch}_x{count}", count) for count in plan.counts] + [
        (f"{plan.arch}_fresh", 1)
    ]:
        config = (
            image_config(largest, plan.precision)
            + groups(placed, count, [0] if placed == "gpu" else None)
            + f"[dynamic_batching]\npreferred_batch_size = {preferred}\n"
            + "max_queue_delay_microseconds = 500\n"
            + ("[parameters]\ncudnn_benchmark = true\n" if placed == "gpu" else "")
            + f'[[warmup]]\nbatch_size = {largest}\ninputs = {{ INPUT = "random" }}\n'
        )
        os.link(program, write_model(root, name, config) / "model.pt2")
    measured = [f"{plan.arch}_x{count}" for count in plan.counts]
    with phase.timed("server ready"):
        server = run.serve("throughput", root, *explicit(*measured))

    rng = np.random.default_rng(0)
    raw = {
        batch: rng.standard_normal((batch, 3, 224, 224)).astype(np.float32).tobytes()
        for batch in plan.batches
    }
    rows = []
    uuid = node.gpus[0].uuid if plan.device == "cuda" else None
    for count, model in zip(plan.counts, measured, strict=True):
        for batch in plan.batches:
            payload = binary_request(
                [("INPUT", "FP32", [batch, 3, 224, 224], raw[batch])], ["OUTPUT"]
            ).payload(server.address, model)
            concurrency = plan.concurrency_per_instance * count
            items, batches = server.stats(model)
            sampler = GpuSampler(uuid)
            with sampler.running():
                result = asyncio.run(
                    loadgen.closed_loop(
                        f"{model} b{batch}", "127.0.0.1", server.port, [payload],
                        concurrency, plan.seconds, plan.warmup_s,
                    )
                )  # fmt: skip
            items_after, batches_after = server.stats(model)
            images = round(result.throughput * batch, 1)
            ratio = round(images / pure[batch]["on_device"], 3)
            rows.append(
                {
                    "instances": count,
                    "batch": batch,
                    "concurrency": concurrency,
                    "images_per_s": images,
                    "pure_images_per_s": pure[batch]["on_device"],
                    "ratio": ratio,
                    "ratio_vs_pure_with_copies": round(images / pure[batch]["with_copies"], 3),
                    "p50_ms": round(result.p50_ms, 2),
                    "p99_ms": round(result.p99_ms, 2),
                    "errors": result.errors,
                    "mean_server_batch": round(
                        (items_after - items) / max(1, batches_after - batches), 1
                    ),
                    "gpu_utilization_pct": sampler.mean(),
                }
            )
            phase.check(f"x{count} batch {batch}: no errors", result.errors == 0, f"{rows[-1]}")
            phase.check(
                f"x{count} batch {batch}: >= 0.9x pure torch images/s",
                ratio >= 0.9,
                f"{images} vs {pure[batch]['on_device']} images/s: {ratio}x",
                goal=True,
            )
    phase.facts["server"] = rows

    # A model loaded now serves its first requests warm (its [[warmup]] ran on the instance).
    fresh = f"{plan.arch}_fresh"
    started = time.monotonic()
    loaded = server.http.post(f"/v2/repository/models/{fresh}/load")
    load_s = round(time.monotonic() - started, 2)
    phase.check("fresh model loads", loaded.status_code == 200, loaded.text[:300])
    server.wait_model_ready(fresh)
    batch = plan.batches[0]
    latencies, failures = _sequential(server, fresh, batch, raw[batch], 2 * plan.first_requests)
    first, rest = latencies[: plan.first_requests], latencies[plan.first_requests :]
    first_p99, rest_p99 = percentile_ms(first, 99), percentile_ms(rest, 99)
    phase.facts["first_requests"] = {
        "load_s": load_s,
        "batch": batch,
        "count": plan.first_requests,
        "first_p50_ms": percentile_ms(first, 50),
        "first_p99_ms": first_p99,
        "first_max_ms": percentile_ms(first, 100),
        "next_p50_ms": percentile_ms(rest, 50),
        "next_p99_ms": rest_p99,
        "failures": failures,
    }
    phase.check("first requests all succeed", not failures, f"{failures[:3]}")
    phase.check(
        f"first-{plan.first_requests} p99 within 2x of the next {plan.first_requests}'s",
        first_p99 <= 2 * rest_p99,
        f"{first_p99} ms vs {rest_p99} ms",
        goal=True,
    )
    best = {
        batch: max(row["ratio"] for row in rows if row["batch"] == batch) for batch in plan.batches
    }
    phase.headline = (
        ", ".join(
            f"b{row['batch']} x{row['instances']}: {row['images_per_s']:.0f} img/s "
            f"({row['ratio']:.2f}x)"
            for row in rows
        )
        + f"; first-{plan.first_requests} p99 {first_p99} ms (next {rest_p99} ms)"
    )
    phase.facts["best_ratio_per_batch"] = best


def _sequential(
    server: Server, model: str, batch: int, raw: bytes, count: int
) -> tuple[list[float], list[str]]:
    """``count`` requests one after another with tritonclient; latencies and failures."""
    from tritonclient.utils import InferenceServerException

    images = np.frombuffer(raw, np.float32).reshape(batch, 3, 224, 224)
    latencies, failures = [], []
    with server.triton() as client:
        for _ in range(count):
            inputs, wanted = image_request(images)
            started = time.perf_counter()
            try:
                client.infer(model, inputs, outputs=wanted)
            except InferenceServerException as exc:
                failures.append(str(exc)[:300])
                continue
            latencies.append(time.perf_counter() - started)
    return latencies, failures
