"""wrk as the bench's load generator: the script it runs sends the closed loop's request
as it is, and its summary becomes a RunResult; a real run where wrk is installed."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from reposerve.tune.load import encode_request
from tools.bench import servers
from tools.bench.wrk import parse, script, wrk_loop

BODY = b'{"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[1.5]}]}'
PAYLOAD = encode_request(
    "127.0.0.1", "/v2/models/m/infer", BODY, {"Content-Type": "application/json"}
)


def test_the_script_sends_the_payloads_request_and_leaves_host_and_length_to_wrk():
    text, path = script(PAYLOAD)
    assert path == "/v2/models/m/infer"
    assert 'wrk.method = "POST"' in text
    assert f"wrk.body = [=[{BODY.decode()}]=]" in text
    assert 'wrk.headers["Content-Type"] = "application/json"' in text
    assert "Host" not in text and "Content-Length" not in text


def test_a_body_holding_a_long_bracket_gets_a_longer_one():
    text, _ = script(encode_request("h", "/p", b'{"s":"]=]"}'))
    assert 'wrk.body = [==[{"s":"]=]"}]==]' in text


def test_the_summary_becomes_a_run_result_counting_errors_apart():
    output = b"Running 5s test\nRESULT 1000 10 5000000 120.5 200.0 900.0 4000.0 150.0\n"
    run = parse("side", 8, output)
    assert (run.completed, run.errors, run.concurrency) == (990, 10, 8)
    assert run.throughput == pytest.approx(198.0)
    assert (run.p50_ms, run.p99_ms, run.max_ms) == pytest.approx((0.1205, 0.9, 4.0))
    with pytest.raises(RuntimeError, match="no summary"):
        parse("side", 8, b"unable to connect")


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt install wrk)")
def test_wrk_drives_the_bare_echo():
    echo = servers.asgi("echo", "tools.bench.baselines:starlette_echo", "uvicorn")
    try:
        run = asyncio.run(wrk_loop("echo", "127.0.0.1", echo.port, [PAYLOAD], 2, 1.0))
    finally:
        echo.stop()
    assert run.completed > 0 and run.errors == 0
    assert 0 < run.p50_ms <= run.p99_ms <= run.max_ms
