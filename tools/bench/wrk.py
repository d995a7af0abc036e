"""wrk as the load generator: a C client that spends a fraction of the CPU the Python
closed loop does, so on a machine of few cores it leaves more of them to the servers it
compares, as a remote client would. Every request is the same one (the first payload's);
wrk counts a non-2xx answer as an error. Debian and Ubuntu ship it (``apt install wrk``).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from reposerve.tune.load import RunResult

# What the script's done() prints: requests, errors, duration (us), then the latency's
# p50, p90, p99, max and mean (us).
_RESULT = re.compile(
    rb"^RESULT (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+)$", re.M
)


def available() -> bool:
    return shutil.which("wrk") is not None


def script(payload: bytes) -> tuple[str, str]:
    """The wrk Lua script that sends ``payload`` (a whole HTTP/1.1 request, as the closed
    loop's payloads are) and reports its summary, and the request's path."""
    head, _, body = payload.partition(b"\r\n\r\n")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, path, _version = request_line.split(" ")
    level = "=" * next(n for n in range(1, 64) if f"]{'=' * n}]" not in body.decode("latin-1"))
    lines = [f'wrk.method = "{method}"', f"wrk.body = [{level}[{body.decode('latin-1')}]{level}]"]
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.lower() not in ("host", "content-length"):  # wrk writes those itself
            lines.append(f'wrk.headers["{name}"] = "{value.strip()}"')
    lines.append(
        "done = function(summary, latency, requests)\n"
        "  local e = summary.errors\n"
        '  io.write(string.format("RESULT %d %d %d %f %f %f %f %f\\n", summary.requests,\n'
        "    e.connect + e.read + e.write + e.status + e.timeout, summary.duration,\n"
        "    latency:percentile(50), latency:percentile(90), latency:percentile(99),\n"
        "    latency.max, latency.mean))\n"
        "end"
    )
    return "\n".join(lines) + "\n", path


def parse(label: str, concurrency: int, output: bytes) -> RunResult:
    """A RunResult from the line the script's done() printed."""
    found = _RESULT.search(output)
    if found is None:
        raise RuntimeError(f"wrk printed no summary: {output.decode(errors='replace')[-500:]}")
    requests, errors, duration_us = (int(found[i]) for i in (1, 2, 3))
    p50, p90, p99, most, mean = (float(found[i]) / 1000 for i in range(4, 9))
    seconds = duration_us / 1e6
    return RunResult(
        label=label,
        mode="closed",
        concurrency=concurrency,
        rate=0.0,
        duration_s=seconds,
        completed=requests - errors,
        errors=errors,
        throughput=(requests - errors) / seconds,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        max_ms=most,
        latency_slope_ms_per_s=0.0,
        mean_ms=mean,
    )


async def wrk_loop(
    label: str,
    host: str,
    port: int,
    payloads: Sequence[bytes],
    concurrency: int,
    duration: float,
) -> RunResult:
    """``concurrency`` connections, each sending its next request when the last one is
    answered, for ``duration`` seconds (one wrk thread: the server gets the other cores)."""
    text, path = script(payloads[0])
    with tempfile.TemporaryDirectory() as folder:
        lua = Path(folder) / "request.lua"
        lua.write_text(text)
        process = await asyncio.create_subprocess_exec(
            "wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration))}s", "--timeout", "10s",
            "-s", str(lua), f"http://{host}:{port}{path}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await process.communicate()
    return parse(label, concurrency, output)
