"""Load for the other two ways clients call: gRPC ModelInfer and streamed responses (SSE).

gRPC runs in a process of its own (``python -m tools.bench.protocols grpc ...``, printing
its RunResult as JSON): grpc.aio brings its own event-loop integration, kept apart from
the uvloop the HTTP load generator runs on. Requests are serialised once; the client
sends bytes, so its per-call cost is grpcio's own.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time

import msgspec
import numpy as np

from tools.bench.loadgen import RunResult, Sample, encode_request, summarise


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
    """``concurrency`` callers on one channel (HTTP/2 streams), as tritonclient.grpc does."""
    import grpc

    from reposerve.grpc import schema

    samples: list[Sample] = []
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/{schema.SERVICE}/ModelInfer")
        await call(payloads[0])  # the connection is up before the clock starts
        start = time.perf_counter()
        measure_from = start + 1.0
        stop_at = measure_from + duration

        async def client(index: int) -> None:
            for payload in itertools.islice(itertools.cycle(payloads), index, None):
                sent = time.perf_counter()
                if sent >= stop_at:
                    return
                try:
                    await call(payload)
                    ok = True
                except grpc.aio.AioRpcError:
                    ok = False
                if sent >= measure_from or not ok:
                    samples.append(Sample(sent - measure_from, time.perf_counter() - sent, ok))

        await asyncio.gather(*(client(index) for index in range(concurrency)))
    return summarise(label, "closed", concurrency, 0.0, samples, duration)


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
