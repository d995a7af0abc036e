"""A lean HTTP/1.1 load generator for V2 requests: closed loop and open loop.

Requests are pre-encoded bytes written on keep-alive connections; responses are framed
by Content-Length only. That keeps the client's cost per request in the tens of
microseconds, so on a small machine it measures the server rather than itself.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import numpy as np


class Sample(msgspec.Struct, array_like=True):
    sent: float  # seconds since the run started (scheduled time in open loop)
    latency: float  # seconds
    ok: bool


class RunResult(msgspec.Struct):
    label: str
    mode: str  # "closed" or "open"
    concurrency: int
    rate: float
    duration_s: float
    completed: int
    errors: int
    throughput: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    latency_slope_ms_per_s: float  # growth of latency over the run (open loop)
    samples: list[Sample] = []
    mean_ms: float = 0.0  # mean latency of the answered requests

    def line(self) -> str:
        load = f"c={self.concurrency}" if self.mode == "closed" else f"rate={self.rate:g}/s"
        return (
            f"{self.label:<28} {load:>12}  {self.throughput:>9.0f} req/s  "
            f"p50 {self.p50_ms:7.2f}  p90 {self.p90_ms:7.2f}  p99 {self.p99_ms:7.2f}  "
            f"max {self.max_ms:7.2f} ms  errors {self.errors}"
        )


def encode_request(
    host: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{key}: {value}" for key, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Connection(asyncio.Protocol):
    transport: asyncio.Transport  # given by _connect, as the connection is made

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._waiter: asyncio.Future[int] | None = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._try_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection closed"))

    def _try_complete(self) -> None:
        if self._waiter is None or self._waiter.done():
            return
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buffer[:end]).lower()
        # The line start matters: Inference-Header-Content-Length also ends in content-length.
        marker = head.find(b"\r\ncontent-length:")
        length = int(head[marker + 17 :].split(b"\r\n", 1)[0]) if marker >= 0 else 0
        if len(self._buffer) < end + 4 + length:
            return
        status = int(head[9:12])
        del self._buffer[: end + 4 + length]
        self._waiter.set_result(status)

    async def request(self, payload: bytes) -> int:
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return await self._waiter


async def _connect(host: str, port: int) -> _Connection:
    transport, connection = await asyncio.get_running_loop().create_connection(
        _Connection, host, port
    )
    connection.transport = transport
    return connection


def summarise(
    label: str, mode: str, concurrency: int, rate: float, samples: list[Sample], duration: float
) -> RunResult:
    ok = [s for s in samples if s.ok]
    latencies = np.array([s.latency for s in ok]) * 1000 if ok else np.zeros(1)
    slope = 0.0
    if len(ok) > 2:
        slope = float(np.polyfit([s.sent for s in ok], latencies, 1)[0])
    return RunResult(
        label=label,
        mode=mode,
        concurrency=concurrency,
        rate=rate,
        duration_s=duration,
        completed=len(ok),
        errors=len(samples) - len(ok),
        throughput=len(ok) / duration,
        p50_ms=float(np.percentile(latencies, 50)),
        p90_ms=float(np.percentile(latencies, 90)),
        p99_ms=float(np.percentile(latencies, 99)),
        max_ms=float(latencies.max()),
        latency_slope_ms_per_s=slope,
        samples=samples if mode == "open" else [],
        mean_ms=float(latencies.mean()),
    )


async def closed_loop(
    label: str,
    host: str,
    port: int,
    payloads: Sequence[bytes],
    concurrency: int,
    duration: float,
    warmup: float = 1.0,
) -> RunResult:
    """``concurrency`` clients, each sending its next request when the last one returns."""
    connections = [await _connect(host, port) for _ in range(concurrency)]

    async def call(index: int, payload: bytes) -> bool:
        try:
            return await connections[index].request(payload) == 200
        except ConnectionError:
            # Servers close keep-alive connections after N requests (Hypercorn: 1000);
            # a real client reconnects and resends, and so do we, once.
            connections[index] = await _connect(host, port)
            try:
                return await connections[index].request(payload) == 200
            except ConnectionError:
                return False

    samples = await drive(call, payloads, concurrency, duration, warmup)
    for connection in connections:
        connection.transport.close()
    return summarise(label, "closed", concurrency, 0.0, samples, duration)


async def drive(
    call: Callable[[int, bytes], Awaitable[bool]],
    payloads: Sequence[bytes],
    concurrency: int,
    duration: float,
    warmup: float = 1.0,
) -> list[Sample]:
    """The closed loop itself: client ``index`` awaits ``call(index, payload)`` (whether it
    succeeded) for payload after payload; samples after ``warmup``, and every failure."""
    samples: list[Sample] = []
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + duration

    async def client(index: int) -> None:
        for payload in itertools.islice(itertools.cycle(payloads), index, None):
            sent = time.perf_counter()
            if sent >= stop_at:
                return
            ok = await call(index, payload)
            if sent >= measure_from or not ok:
                samples.append(Sample(sent - measure_from, time.perf_counter() - sent, ok))

    await asyncio.gather(*(client(index) for index in range(concurrency)))
    return samples


async def open_loop(
    label: str, host: str, port: int, payloads: Sequence[bytes], rate: float, duration: float
) -> RunResult:
    """Send at a fixed rate whatever the latency, on as many connections as that needs.

    Latency counts from each request's scheduled time, so a stalled server cannot hide
    its queueing (no coordinated omission).
    """
    idle: list[_Connection] = [await _connect(host, port) for _ in range(int(rate) + 1)]
    samples: list[Sample] = []
    count = int(rate * duration)
    start = time.perf_counter() + 0.05

    async def one(index: int, payload: bytes) -> None:
        scheduled = start + index / rate
        connection = idle.pop() if idle else await _connect(host, port)
        try:
            ok = await connection.request(payload) == 200
        except ConnectionError:
            ok = False
        samples.append(Sample(scheduled - start, time.perf_counter() - scheduled, ok))
        if not connection.transport.is_closing():
            idle.append(connection)

    tasks = []
    for index, payload in zip(range(count), itertools.cycle(payloads)):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(index, payload)))
    await asyncio.gather(*tasks)
    for connection in idle:
        connection.transport.close()
    samples.sort(key=lambda s: s.sent)
    return summarise(label, "open", 0, rate, samples, time.perf_counter() - start)
