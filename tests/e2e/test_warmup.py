"""Warmup runs on every instance, and on every replacement, before it takes traffic."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.server import running_server
from tests.toy_models import RECORDS, vector_config, write_model

pytestmark = pytest.mark.e2e

WARMUPS = """
    [[instance_group]]
    count = 3
    [dynamic_batching]
    preferred_batch_size = [4, 8]
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
    with running_server(repository, tmp_path) as server:
        pids = sorted(server.instance_pids())
        assert len(pids) == 3
        ran = _executed(folder)
        # entry 1 at 2, then the preferred 4 and 8; entry 2 at its own 4, then 8
        sizes = [2, 4, 8, 4, 8]
        assert sorted(ran) == sorted((pid, size) for pid in pids for size in sizes)
        for pid in pids:  # in order, on every instance
            assert [size for ran_pid, size in ran if ran_pid == pid] == sizes
        stats = httpx.get(f"{server.url}/v2/models/warm/stats").json()["model_stats"][0]
        assert stats["execution_count"] == 15

        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while len(set(server.instance_pids()) - set(pids)) < 1:
            assert time.monotonic() < deadline, "no replacement"
            time.sleep(0.05)
        (replacement,) = set(server.instance_pids()) - set(pids)
        while httpx.get(f"{server.url}/v2/models/warm/ready").status_code != 200 or len(
            [p for p, _ in _executed(folder) if p == replacement]
        ) < len(sizes):
            assert time.monotonic() < deadline, "replacement not warmed"
            time.sleep(0.05)
        body = {"inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
        for _ in range(12):  # enough for the replacement to serve some
            assert httpx.post(f"{server.url}/v2/models/warm/infer", json=body).status_code == 200
        served = [size for pid, size in _executed(folder) if pid == replacement]
        assert served[: len(sizes)] == sizes  # its warmup came before anything it served
