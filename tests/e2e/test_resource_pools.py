"""Pools that grow under a burst shrink back once the burst is over: slots for batches
(a memfd a slot, held by the front and the instance) and slots for model calls (a memfd
of the instance's, opened by the front too). Counted as each process's open descriptors,
before and after, with real servers and clients."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from tests.server import running_server
from tests.toy_models import write_model

pytestmark = pytest.mark.e2e

STREAMER = """
    import asyncio
    import numpy as np

    class Model:
        async def execute(self, inputs):
            for index in range(int(inputs["COUNT"][0])):
                await asyncio.sleep(0.05)
                yield {"INDEX": np.array([index], np.int32)}
"""
STREAMER_CONFIG = """
    [[input]]
    name = "COUNT"
    datatype = "INT32"
    shape = [1]
    [[output]]
    name = "INDEX"
    datatype = "INT32"
    shape = [1]
"""
# Calls itself COUNT deep: a burst of nested calls, each with a call slot.
DEEP = """
    import numpy as np

    class Model:
        def load(self, context):
            self.context = context

        async def execute(self, inputs):
            count = int(inputs["COUNT"][0])
            if count > 0:
                await self.context.infer("deep", {"COUNT": np.array([count - 1], np.int32)})
            return {"INDEX": np.array([count], np.int32)}
"""


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _settles(pids: dict[str, int], before: dict[str, int], slack: int = 2) -> dict[str, int]:
    """Wait (bounded) until every process is back within ``slack`` descriptors."""
    deadline = time.monotonic() + 30
    while True:
        now = {name: _descriptors(pid) for name, pid in pids.items()}
        if all(now[name] <= before[name] + slack for name in pids):
            return now
        assert time.monotonic() < deadline, f"still held: {now}, before: {before}"
        time.sleep(0.2)


def test_slot_pools_shrink_back_after_a_burst(tmp_path):
    root = tmp_path / "repository"
    write_model(root, "streamer", STREAMER_CONFIG, STREAMER)
    write_model(root, "deep", STREAMER_CONFIG, DEEP)
    with running_server(root, tmp_path) as server:
        children = server.instance_pids()
        pids = {"front": server.process.pid} | {f"instance {p}": p for p in children}

        async def burst(streams: int, calls: int, depth: int) -> list[int]:
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as http:

                async def stream() -> int:
                    url = "/v2/models/streamer/generate_stream"
                    async with http.stream("POST", url, json={"COUNT": 4}) as reply:
                        return sum([1 async for line in reply.aiter_lines() if line])

                async def deep() -> int:
                    reply = await http.post("/v2/models/deep/generate", json={"COUNT": depth})
                    return reply.json()["INDEX"]

                return await asyncio.gather(
                    *(stream() for _ in range(streams)), *(deep() for _ in range(calls))
                )

        # Warm: the pools at the size a light load keeps them at.
        assert asyncio.run(burst(streams=3, calls=1, depth=3)) == [4, 4, 4, 3]
        before = {name: _descriptors(pid) for name, pid in pids.items()}
        answers = asyncio.run(burst(streams=100, calls=5, depth=20))
        assert answers == [4] * 100 + [20] * 5  # every stream whole, every call answered
        grown = {name: _descriptors(pid) for name, pid in pids.items()}
        assert grown["front"] > before["front"] + 50  # the burst did grow the pools
        _settles(pids, before)


def test_an_instance_that_dies_takes_its_slots_with_it(tmp_path):
    """Killed three times and replaced each time: the front holds no descriptor of the
    dead processes' slots (it does not wait for the old process objects to be collected)."""
    root = tmp_path / "repository"
    write_model(root, "streamer", STREAMER_CONFIG, STREAMER)
    with running_server(root, tmp_path) as server:
        front = {"front": server.process.pid}
        before = {"front": _descriptors(server.process.pid)}
        for _ in range(3):
            (dead,) = server.instance_pids()
            os.kill(dead, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while (
                server.instance_pids() in ([], [dead])
                or httpx.get(f"{server.url}/v2/models/streamer/ready").status_code != 200
            ):
                assert time.monotonic() < deadline, "no replacement"
                time.sleep(0.05)
        _settles(front, before, slack=0)
