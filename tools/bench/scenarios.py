"""The benchmark scenarios: each builds its repository, runs its targets and baselines in
one go, and returns results plus the ratios the issues ask about."""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import textwrap
import urllib.request
from pathlib import Path

import msgspec
import numpy as np

from reposerve.tune.load import (
    RunResult,
    closed_loop,
    encode_request,
    open_loop,
)
from reposerve.tune.requests import binary_request
from tools.bench import servers
from tools.bench.protocols import perf_analyzer_run, sse_streams

HOST = "127.0.0.1"


class Report(msgspec.Struct):
    scenario: str
    results: list[RunResult]
    facts: dict[str, float] = {}
    # What fell below a floor the scenario keeps (the CLI then exits 1).
    slides: list[str] = []

    def text(self) -> str:
        lines = [f"== {self.scenario} ({servers.environment_note()})"]
        lines += [result.line() for result in self.results]
        lines += [f"{key}: {value:.3f}" for key, value in self.facts.items()]
        lines += [f"SLIDE {slide}" for slide in self.slides]
        return "\n".join(lines)


def _model(root: Path, name: str, config: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.toml").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))


def vector_config(size: int, max_batch: int, batching: bool) -> str:
    return f"""
        max_batch_size = {max_batch}
        [[input]]
        name = "INPUT"
        datatype = "FP32"
        shape = [{size}]
        [[output]]
        name = "OUTPUT"
        datatype = "FP32"
        shape = [{size}]
        {"[dynamic_batching]" if batching else ""}
    """


def _json_payloads(model: str, size: int, count: int = 64) -> list[bytes]:
    rng = np.random.default_rng(0)
    payloads = []
    for _ in range(count):
        values = rng.standard_normal(size).astype(np.float32).tolist()
        body = msgspec.json.encode(
            {"inputs": [{"name": "INPUT", "shape": [1, size], "datatype": "FP32", "data": values}]}
        )
        payloads.append(
            encode_request(
                HOST, f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"}
            )
        )
    return payloads


def _binary_payloads(model: str, size: int, count: int = 64) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [
        binary_request(
            [("INPUT", "FP32", [1, size], rng.standard_normal(size).astype(np.float32).tobytes())],
            ["OUTPUT"],
        ).payload(HOST, model)
        for _ in range(count)
    ]


def _mean_batch(port: int, model: str) -> tuple[int, int]:
    url = f"http://{HOST}:{port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url) as reply:
        stats = json.loads(reply.read())["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


# The least share of a bare Starlette echo's requests/s (same uvicorn, same run, rounds
# interleaved) that reposerve's JSON path may answer at each concurrency before the
# overhead benchmark reports a slide: 80 % of what the 2-core development machine
# measured on 2026-12-03 (medians of two runs: 0.36, 0.45, 0.55), so noise passes and a
# lost fifth does not. Raise them as overhead is won back.
ECHO_FLOOR = {1: 0.29, 8: 0.36, 32: 0.44}
ECHO = "starlette echo uvicorn"
# The overhead workload's model: +1 on FP32[16], dynamically batched.
PLUS_ONE_CONFIG = vector_config(16, 64, batching=True)
PLUS_ONE = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 1}
"""


async def overhead(
    duration: float, concurrencies: tuple[int, ...] = (1, 8, 32), rounds: int = 3
) -> Report:
    """+1 on an FP32[16] vector: reposerve against the bare HTTP stacks and FastAPI.
    reposerve and the bare Starlette echo on uvicorn (the ceiling of the stack it runs
    on) run in interleaved rounds, each pair back to back, so the ratio of the two does
    not move with the machine; the median round's ratio is reported, and checked
    against ``ECHO_FLOOR``."""
    runs: dict[tuple[str, int], list[RunResult]] = {}
    ratios: dict[str, list[float]] = {}
    facts: dict[str, float] = {}
    json_payloads = _json_payloads("plus_one", 16)
    ours = (
        ("reposerve json", json_payloads),
        ("reposerve binary", _binary_payloads("plus_one", 16)),
    )
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _model(root, "plus_one", PLUS_ONE_CONFIG, PLUS_ONE)
        server = servers.reposerve(root)
        echo = servers.asgi(ECHO, "tools.bench.baselines:starlette_echo", "uvicorn")
        try:
            facts["reposerve time to ready (s)"] = server.ready_s
            facts["reposerve idle memory, front + instance (MiB PSS)"] = server.memory_mib()
            for _ in range(rounds):
                for concurrency in concurrencies:
                    bare = await closed_loop(
                        ECHO, HOST, echo.port, json_payloads, concurrency, duration
                    )
                    runs.setdefault((ECHO, concurrency), []).append(bare)
                    for label, payloads in ours:
                        before = _mean_batch(server.port, "plus_one")
                        result = await closed_loop(
                            label, HOST, server.port, payloads, concurrency, duration
                        )
                        after = _mean_batch(server.port, "plus_one")
                        runs.setdefault((label, concurrency), []).append(result)
                        facts[f"{label} c={concurrency} mean batch"] = (after[0] - before[0]) / max(
                            after[1] - before[1], 1
                        )
                        key = f"c={concurrency} {label} / starlette echo throughput"
                        ratios.setdefault(key, []).append(result.throughput / bare.throughput)
        finally:
            server.stop()
            echo.stop()
    results = [median_run(found) for found in runs.values()]
    facts.update({key: statistics.median(found) for key, found in ratios.items()})
    baselines = [
        ("starlette echo hypercorn", "tools.bench.baselines:starlette_echo", "hypercorn"),
        ("fastapi +1 in-process", "tools.bench.baselines:fastapi_plus_one", "uvicorn"),
    ]
    for label, app, http in baselines:
        baseline = servers.asgi(label, app, http)
        try:
            for concurrency in concurrencies:
                results.append(
                    await closed_loop(
                        label, HOST, baseline.port, json_payloads, concurrency, duration
                    )
                )
        finally:
            baseline.stop()
    by_key = {(r.label, r.concurrency): r for r in results}
    for concurrency in concurrencies:
        fastapi = by_key[("fastapi +1 in-process", concurrency)]
        facts[f"c={concurrency} reposerve json / fastapi throughput"] = (
            by_key[("reposerve json", concurrency)].throughput / fastapi.throughput
        )
    return Report("overhead", results, facts, echo_slides(facts, ECHO_FLOOR))


def echo_slides(facts: dict[str, float], floors: dict[int, float]) -> list[str]:
    """What fell under its floor: reposerve's JSON requests/s as a share of the bare
    echo's, at each concurrency that has a floor and was measured."""
    slides = []
    for concurrency, floor in floors.items():
        ratio = facts.get(f"c={concurrency} reposerve json / starlette echo throughput")
        if ratio is not None and ratio < floor:
            slides.append(
                f"c={concurrency}: reposerve json answered {ratio:.2f}x the bare echo's "
                f"requests/s, under the floor of {floor:.2f}x"
            )
    return slides


def median_run(found: list[RunResult]) -> RunResult:
    """The run of median throughput (the lower middle of an even count)."""
    ordered = sorted(found, key=lambda run: run.throughput)
    return ordered[(len(ordered) - 1) // 2]


async def batching(duration: float, concurrency: int = 64) -> Report:
    """A 50 ms model at concurrency 64, with dynamic batching on and off."""
    code = """
        import time

        class Model:
            def execute(self, inputs):
                time.sleep(0.05)
                return {"OUTPUT": inputs["INPUT"] * 2}
    """
    results = []
    facts: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _model(root, "slow_batched", vector_config(16, 64, batching=True), code)
        _model(root, "slow_alone", vector_config(16, 64, batching=False), code)
        server = servers.reposerve(root)
        try:
            for model in ("slow_batched", "slow_alone"):
                payloads = _json_payloads(model, 16)
                results.append(
                    await closed_loop(model, HOST, server.port, payloads, concurrency, duration)
                )
                items, executions = _mean_batch(server.port, model)
                facts[f"{model} mean batch"] = items / max(executions, 1)
        finally:
            server.stop()
    facts["throughput batched / alone"] = results[0].throughput / results[1].throughput
    return Report("batching", results, facts)


async def async_sleep(duration: float, rate: float = 100.0) -> Report:
    """MLServer's known complaint: an async model awaiting asyncio.sleep(1), open loop."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        config = vector_config(16, 0, batching=False).replace("[16]", "[1, 16]")
        _model(root, "sleep_1s", config, """
            import asyncio

            class Model:
                async def execute(self, inputs):
                    await asyncio.sleep(1)
                    return {"OUTPUT": inputs["INPUT"]}
        """)  # fmt: skip
        server = servers.reposerve(root)
        try:
            payloads = _json_payloads("sleep_1s", 16)
            result = await open_loop("async sleep(1)", HOST, server.port, payloads, rate, duration)
        finally:
            server.stop()
    facts = {"latency slope (ms per s of run)": result.latency_slope_ms_per_s}
    return Report("async-sleep", [result], facts)


async def staging(duration: float, rounds: int = 3) -> Report:
    """One sync instance with the next batch staged in a second slot
    (``stage_next_batch``, the default) and without, for an execute that keeps a device
    busy for 2 ms (a sleep: the CPU is free meanwhile, as while a GPU runs) and for one
    that computes on the CPU for about as long. Rounds are interleaved, best of each."""
    device = """
        import time

        class Model:
            def execute(self, inputs):
                time.sleep(0.002)
                return {"OUTPUT": inputs["INPUT"] * 2}
    """
    cpu = """
        import numpy as np

        class Model:
            def load(self, context):
                self.weights = np.random.default_rng(0).random((192, 192), np.float32)

            def execute(self, inputs):
                work = self.weights
                for _ in range(5):
                    work = np.tanh(work @ self.weights)
                return {"OUTPUT": inputs["INPUT"] * 2}
    """
    batched = "[dynamic_batching]\npreferred_batch_size = [8]"
    cases = [
        ("device alone", device, "", 8),
        ("device batch 8", device, batched, 32),
        ("cpu alone", cpu, "", 8),
    ]
    best: dict[str, RunResult] = {}
    facts: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for case, code, batching, _ in cases:
            for stage in ("true", "false"):
                config = vector_config(16, 8, batching=False) + batching
                config += f"\n[parameters]\nstage_next_batch = {stage}\n"
                _model(root, _staging_model(case, stage), config, code)
        server = servers.reposerve(root)
        try:
            for _ in range(rounds):
                for case, _, _, concurrency in cases:
                    for stage in ("true", "false"):
                        model = _staging_model(case, stage)
                        label = f"{case}, staged {stage}"
                        result = await closed_loop(
                            label, HOST, server.port, _binary_payloads(model, 16),
                            concurrency, duration,
                        )  # fmt: skip
                        if label not in best or result.throughput > best[label].throughput:
                            best[label] = result
        finally:
            server.stop()
    for case, _, _, _ in cases:
        staged, unstaged = best[f"{case}, staged true"], best[f"{case}, staged false"]
        facts[f"{case}: staged / unstaged throughput"] = staged.throughput / unstaged.throughput
    return Report("staging", list(best.values()), facts)


def _staging_model(case: str, stage: str) -> str:
    return f"{case.replace(' ', '')}_{'staged' if stage == 'true' else 'unstaged'}"


def _pure_resnet(batch: int, duration: float) -> float:
    """Images/s of ResNet-50 alone: preprocessed tensors, torch.inference_mode, no server."""
    import os
    import time

    import torch
    import torchvision

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    net = torchvision.models.resnet50(weights=None).eval()
    images = torch.randn(batch, 3, 224, 224)
    with torch.inference_mode():
        for _ in range(2):
            net(images)
        done = 0
        started = time.perf_counter()
        while time.perf_counter() - started < duration:
            net(images)
            done += batch
    return done / (time.perf_counter() - started)


def _jpeg_payloads(model: str, output: str = "CLASS", count: int = 32) -> list[bytes]:
    import io
    import struct

    from PIL import Image

    rng = np.random.default_rng(0)
    payloads = []
    for _ in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(buffer, "JPEG")
        raw = struct.pack("<I", len(buffer.getvalue())) + buffer.getvalue()
        payloads.append(
            binary_request([("IMAGE", "BYTES", [1, 1], raw)], [output]).payload(HOST, model)
        )
    return payloads


def _tensor_payloads(model: str, count: int = 8) -> list[bytes]:
    rng = np.random.default_rng(0)
    shape = [1, 3, 224, 224]
    return [
        binary_request(
            [("input", "FP32", shape, rng.standard_normal(shape).astype(np.float32).tobytes())],
            ["logits"],
        ).payload(HOST, model)
        for _ in range(count)
    ]


async def images(duration: float, concurrencies: tuple[int, ...] = (16, 64)) -> Report:
    """ResNet-50 images/s: the model alone (batch 8, 16) against the server at each
    concurrency, on JPEG bytes through the monolithic image_classifier and through the
    image_pipeline ensemble (preprocess -> resnet50_onnx -> postprocess), and on
    preprocessed tensors (resnet50_onnx alone)."""
    import subprocess
    import sys

    facts = {f"pure torch batch {b} (images/s)": _pure_resnet(b, duration) for b in (8, 16)}
    results = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        bundled = servers.ROOT / "model_repository"
        for name in ("image_classifier", "preprocess", "postprocess"):
            shutil.copytree(bundled / name, root / name)
        subprocess.run(
            [sys.executable, "tools/export_examples.py", "--repository", str(root)],
            cwd=servers.ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(root / "resnet50_torch")
        server = servers.reposerve(root)
        try:
            for concurrency in concurrencies:
                for model, payloads in (
                    ("image_classifier", _jpeg_payloads("image_classifier")),
                    ("image_pipeline", _jpeg_payloads("image_pipeline", "CLASS_IDS")),
                    ("resnet50_onnx", _tensor_payloads("resnet50_onnx")),
                ):
                    result = await closed_loop(
                        f"{model} (1 image/request)", HOST, server.port, payloads, concurrency,
                        duration, warmup=3.0,
                    )  # fmt: skip
                    results.append(result)
                    key = f"c={concurrency} {model}"
                    facts[f"{key} images/s / pure batch 8"] = (
                        result.throughput / facts["pure torch batch 8 (images/s)"]
                    )
                by_model = {r.label.split()[0]: r.throughput for r in results[-3:]}
                facts[f"c={concurrency} image_pipeline / image_classifier images/s"] = (
                    by_model["image_pipeline"] / by_model["image_classifier"]
                )
            for model in ("image_classifier", "resnet50_onnx", "preprocess", "postprocess"):
                items, executions = _mean_batch(server.port, model)
                facts[f"{model} mean batch"] = items / max(executions, 1)
        finally:
            server.stop()
    return Report("images", results, facts)


_PLUS_ONE = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 1}
"""


async def protocols(duration: float, concurrency: int = 32, rounds: int = 3) -> Report:
    """The overhead workload (+1 on FP32[16]) at one concurrency over gRPC, HTTP binary
    and, as the baseline, an in-process FastAPI app; rounds interleaved, best of each.
    The gRPC client is grpcio's (in its own process), the HTTP one our lean generator;
    perf_analyzer (C++, the same cost either way) drives both protocols too, for the
    server's own gRPC / HTTP ratio."""
    best: dict[str, RunResult] = {}

    def keep(result: RunResult | None) -> None:
        if result is None:  # perf_analyzer cannot run here
            return
        if result.label not in best or result.throughput > best[result.label].throughput:
            best[result.label] = result

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _model(root, "plus_one", vector_config(16, 64, batching=True), _PLUS_ONE)
        grpc_port = servers.free_port()
        server = servers.reposerve(root, "--grpc-port", str(grpc_port))
        fastapi = servers.asgi("fastapi", "tools.bench.baselines:fastapi_plus_one", "uvicorn")
        try:
            binary = _binary_payloads("plus_one", 16)
            json_payloads = _json_payloads("plus_one", 16)
            for _ in range(rounds):
                for protocol, port in (("grpc", grpc_port), ("http", server.port)):
                    label = f"reposerve {protocol} (perf_analyzer)"
                    address = f"{HOST}:{port}"
                    keep(
                        await perf_analyzer_run(
                            label, protocol, address, "plus_one", concurrency, duration
                        )
                    )
                keep(await _grpc_run(f"{HOST}:{grpc_port}", concurrency, duration))
                keep(
                    await closed_loop(
                        "reposerve http binary", HOST, server.port, binary, concurrency, duration
                    )
                )
                keep(
                    await closed_loop(
                        "fastapi +1 in-process json",
                        HOST,
                        fastapi.port,
                        json_payloads,
                        concurrency,
                        duration,
                    )
                )
        finally:
            server.stop()
            fastapi.stop()
    grpc_result = best["reposerve grpc"]
    http = best["reposerve http binary"]
    baseline = best["fastapi +1 in-process json"]
    facts = {
        f"c={concurrency} grpc / http binary throughput": grpc_result.throughput / http.throughput,
        f"c={concurrency} grpc / fastapi throughput": grpc_result.throughput / baseline.throughput,
        f"c={concurrency} http binary / fastapi throughput": http.throughput / baseline.throughput,
    }
    analyzed = [best.get(f"reposerve {protocol} (perf_analyzer)") for protocol in ("grpc", "http")]
    if analyzed[0] is not None and analyzed[1] is not None:
        facts[f"c={concurrency} perf_analyzer grpc / http throughput"] = (
            analyzed[0].throughput / analyzed[1].throughput
        )
    return Report("protocols", list(best.values()), facts)


async def _grpc_run(address: str, concurrency: int, duration: float) -> RunResult:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tools.bench.protocols", "grpc", "--address", address,
        "--model", "plus_one", "--concurrency", str(concurrency), "--duration", str(duration),
        stdout=asyncio.subprocess.PIPE, cwd=servers.ROOT,
    )  # fmt: skip
    output, _ = await process.communicate()
    if process.returncode:
        raise RuntimeError(f"the gRPC load client failed with code {process.returncode}")
    return msgspec.json.decode(output, type=RunResult)


async def streaming(duration: float, stream_counts: tuple[int, ...] = (1, 16)) -> Report:
    """The bundled ``text_stream`` example streaming 32 words per request over SSE at 1 and
    16 concurrent streams, against the same stream made in-process by a bare Starlette app
    (the ceiling): with no delay between words (the server's own cost per response) and
    with 10 ms (a model that takes its time, as a text generator does)."""
    path = "/v2/models/text_stream/generate_stream"
    facts: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        shutil.copytree(servers.ROOT / "model_repository" / "text_stream", root / "text_stream")
        server = servers.reposerve(root)
        baseline = servers.asgi("starlette sse", "tools.bench.baselines:starlette_sse", "uvicorn")
        try:
            for delay_ms in (0, 10):
                body = msgspec.json.encode(
                    {"text_input": " ".join(["word"] * 32), "delay_ms": delay_ms}
                )
                for streams in stream_counts:
                    case = f"delay {delay_ms} ms streams={streams}"
                    for label, port in (
                        ("reposerve", server.port),
                        ("starlette sse", baseline.port),
                    ):
                        result = await sse_streams(label, HOST, port, path, body, streams, duration)
                        print(f"{case}: {result.line()}", flush=True)
                        key = f"{case} {label}"
                        facts[f"{key} responses/s"] = result.responses_per_s
                        facts[f"{key} first response p50 (ms)"] = result.first_p50_ms
                        facts[f"{key} first response p99 (ms)"] = result.first_p99_ms
                        facts[f"{key} errors"] = result.errors
                    facts[f"{case} reposerve / starlette sse responses/s"] = (
                        facts[f"{case} reposerve responses/s"]
                        / facts[f"{case} starlette sse responses/s"]
                    )
        finally:
            server.stop()
            baseline.stop()
    return Report("streaming", [], facts)


SCENARIOS = {
    "overhead": overhead,
    "protocols": protocols,
    "streaming": streaming,
    "batching": batching,
    "async-sleep": async_sleep,
    "images": images,
    "staging": staging,
}
