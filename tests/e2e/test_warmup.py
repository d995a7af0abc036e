"""Warmup runs on every instance, and on every replacement, before it takes traffic."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.server import start_server
from tests.toy_models import RECORDS, vector_config, write_model

pytestmark = pytest.mark.e2e

WARMUPS = """
    [[instance_group]]
    count = 3
    [[warmup]]
    batch_size = 2
    [[warmup]]
    batch_size = 4
    inputs = { INPUT = "random" }
"""


def _executed(folder) -> list[tuple[int, int]]:
    lines = (folder / "1" / "EXECUTED").read_text().split()
    return [(int(pid), int(size)) for pid, size in zip(lines[::2], lines[1::2], strict=True)]


def test_every_instance_and_every_replacement_is_warmed_before_it_serves(repository, tmp_path):
    folder = write_model(repository, "warm", vector_config(size=2, extra=WARMUPS), RECORDS)
    server = start_server(repository, tmp_path)
    try:
        pids = sorted(server.instance_pids())
        assert len(pids) == 3
        ran = _executed(folder)
        assert sorted(ran) == sorted((pid, size) for pid in pids for size in (2, 4))
        stats = httpx.get(f"{server.url}/v2/models/warm/stats").json()["model_stats"][0]
        assert stats["execution_count"] == 6

        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while len(set(server.instance_pids()) - set(pids)) < 1:
            assert time.monotonic() < deadline, "no replacement"
            time.sleep(0.05)
        (replacement,) = set(server.instance_pids()) - set(pids)
        while (
            httpx.get(f"{server.url}/v2/models/warm/ready").status_code != 200
            or len([p for p, _ in _executed(folder) if p == replacement]) < 2
        ):
            assert time.monotonic() < deadline, "replacement not warmed"
            time.sleep(0.05)
        body = {"inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
        for _ in range(12):  # enough for the replacement to serve some
            assert httpx.post(f"{server.url}/v2/models/warm/infer", json=body).status_code == 200
        first_two = [size for pid, size in _executed(folder) if pid == replacement][:2]
        assert first_two == [2, 4]  # its warmup came before anything it served
    finally:
        assert server.stop() == 0, server.log()
