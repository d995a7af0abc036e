"""Load for the other two ways clients call: gRPC ModelInfer and streamed responses (SSE),
and Triton's perf_analyzer as a client that costs the same over HTTP and gRPC.

gRPC runs in a process of its own (``python -m tools.bench.protocols grpc ...``, printing
its RunResult as JSON): grpc.aio brings its own event-loop integration, kept apart from
the uvloop the HTTP load generator runs on. Requests are serialised once; the client
sends bytes, so its per-call cost is grpcio's own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

from reposerve.tune.load import RunResult, drive, encode_request, summarise


def infer_request_bytes(model: str, size: int, count: int = 16) -> list[bytes]:
    """Serialised ``ModelInferRequest``s of FP32[1, size] in raw_input_contents."""
    from reposerve.grpc import schema

    request_class = schema.message_class(f"{schema.PACKAGE}.ModelInferRequest")
    rng = np.random.default_rng(0)
    requests = []
    for _ in range(count):
        request = request_class(model_name=model)
        request.inputs.add(name="INPUT", datatype="FP32", shape=[1, size])
        request.outputs.add(name="OUTPUT")
        request.raw_input_contents.append(rng.standard_normal(size).astype(np.float32).tobytes())
        requests.append(request.SerializeToString())
    return requests


async def grpc_closed_loop(
    label: str, address: str, payloads: list[bytes], concurrency: int, duration: float
) -> RunResult:
    """``concurrency`` callers on one channel (HTTP/2 streams), as tritonclient.grpc does,
    with its message limits (2 GiB - 1 either way, not gRPC's 4 MiB)."""
    import grpc

    from reposerve.grpc import schema

    limits = [
        ("grpc.max_send_message_length", 2**31 - 1),
        ("grpc.max_receive_message_length", 2**31 - 1),
    ]
    async with grpc.aio.insecure_channel(address, options=limits) as channel:
        rpc = channel.unary_unary(f"/{schema.SERVICE}/ModelInfer")
        await rpc(payloads[0])  # the connection is up before the clock starts

        async def call(index: int, payload: bytes) -> bool:
            try:
                await rpc(payload)
            except grpc.aio.AioRpcError:
                return False
            return True

        samples = await drive(call, payloads, concurrency, duration)
    return summarise(label, "closed", concurrency, 0.0, samples, duration)


PERF_ANALYZER = Path(sys.executable).parent / "perf_analyzer"


def perf_analyzer_environment() -> dict[str, str]:
    """The environment perf_analyzer starts in: the tritonclient wheel's binary links
    libcudart, which the nvidia-cuda-runtime wheel (a test dependency) holds."""
    env = dict(os.environ)
    try:
        import nvidia.cuda_runtime
    except ImportError:
        return env
    runtime = str(Path(next(iter(nvidia.cuda_runtime.__path__))) / "lib")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [runtime, env.get("LD_LIBRARY_PATH")]))
    return env


# Model Analyzer profiling a running reposerve (its remote launch mode): the head of its
# config that every use shares; each adds its search and its models.
ANALYZER_REMOTE_MODE = """\
model_repository: {repository}
triton_launch_mode: remote
triton_http_endpoint: {address}
triton_metrics_url: http://127.0.0.1:{metrics_port}/metrics
client_protocol: http
output_model_repository_path: {out}/variants
override_output_model_repository: true
checkpoint_directory: {out}/checkpoints
export_path: {out}/export
"""


def analyzer_environment() -> dict[str, str]:
    """Model Analyzer runs perf_analyzer from PATH: .venv's, with its CUDA runtime."""
    env = perf_analyzer_environment()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    return env


async def perf_analyzer_run(
    label: str, protocol: str, address: str, model: str, concurrency: int, duration: float
) -> RunResult | None:
    """perf_analyzer at ``concurrency`` for about ``duration`` seconds (binary tensors);
    None when it cannot run here."""
    if not PERF_ANALYZER.exists():
        return None
    process = await asyncio.create_subprocess_exec(
        str(PERF_ANALYZER), "-m", model, "-u", address, "-i", protocol,
        "--concurrency-range", str(concurrency),
        "--measurement-interval", str(int(duration * 1000 / 3)),
        "--stability-percentage", "100", "--max-trials", "3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=perf_analyzer_environment(),
    )  # fmt: skip
    output = (await process.communicate())[0].decode(errors="replace")
    throughput = re.search(r"Throughput: ([\d.]+) infer/sec", output)
    if process.returncode or throughput is None:
        return None

    def latency_ms(name: str) -> float:
        found = re.search(rf"{name} latency: (\d+) usec", output)
        return int(found[1]) / 1000 if found else 0.0

    rate = float(throughput[1])
    return RunResult(
        label=label, mode="closed", concurrency=concurrency, rate=0.0, duration_s=duration,
        completed=int(rate * duration), errors=0, throughput=rate,
        p50_ms=latency_ms("p50"), p90_ms=latency_ms("p90"), p99_ms=latency_ms("p99"),
        max_ms=0.0, latency_slope_ms_per_s=0.0,
    )  # fmt: skip


class StreamResult(msgspec.Struct):
    label: str
    streams: int
    requests: int
    responses_per_s: float  # tokens/s, across the streams
    first_p50_ms: float  # time to the first response
    first_p99_ms: float
    errors: int

    def line(self) -> str:
        return (
            f"{self.label:<28} {f'streams={self.streams}':>12}  {self.responses_per_s:>9.0f} "
            f"responses/s  first response p50 {self.first_p50_ms:6.2f}  "
            f"p99 {self.first_p99_ms:6.2f} ms  requests {self.requests}  errors {self.errors}"
        )


async def sse_streams(
    label: str, host: str, port: int, path: str, body: bytes, streams: int, duration: float
) -> StreamResult:
    """``streams`` clients, each opening the next stream when the last one ends; counts
    the events of each and when the first came."""
    request = encode_request(host, path, body, {"Content-Type": "application/json"})
    firsts: list[float] = []
    responses = 0
    errors = 0
    stop_at = time.perf_counter() + duration

    async def client() -> None:
        nonlocal responses, errors
        while time.perf_counter() < stop_at:
            reader, writer = await asyncio.open_connection(host, port)
            sent = time.perf_counter()
            writer.write(request.replace(b"Host:", b"Connection: close\r\nHost:", 1))
            first = None
            buffer = b""
            while chunk := await reader.read(65536):
                buffer += chunk
                events = buffer.count(b"data: ")
                if events and first is None:
                    first = time.perf_counter() - sent
            writer.close()
            if first is None or b'"error"' in buffer:
                errors += 1
                continue
            firsts.append(first)
            responses += buffer.count(b"data: ")

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(streams)))
    elapsed = time.perf_counter() - started
    first_ms = np.array(firsts or [0.0]) * 1000
    return StreamResult(
        label=label,
        streams=streams,
        requests=len(firsts),
        responses_per_s=responses / elapsed,
        first_p50_ms=float(np.percentile(first_ms, 50)),
        first_p99_ms=float(np.percentile(first_ms, 99)),
        errors=errors,
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.protocols")
    parser.add_argument("kind", choices=["grpc"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--label", default="reposerve grpc")
    args = parser.parse_args()
    payloads = infer_request_bytes(args.model, args.size)
    result = asyncio.run(
        grpc_closed_loop(args.label, args.address, payloads, args.concurrency, args.duration)
    )
    sys.stdout.buffer.write(msgspec.json.encode(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
