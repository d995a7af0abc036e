"""Client system shared memory: regions registered, used and unregistered, over and over.

Each round makes a POSIX shared-memory object, registers it, has ``adder`` read its input
from the region and write its output back into it, checks the output there, and
unregisters it. Now and then a registration that lies about the object (an offset past
its end) must be refused with a 400, harming nothing. A region's file descriptors and
mappings, if the server kept any past an unregister, would show as growth in the front's
descriptors, which the soak checks.
"""

from __future__ import annotations

import asyncio
import itertools
import os

import httpx
import numpy as np

from tools.soak.outcomes import Outcomes, http_client

VALUES = 16 * 4  # bytes of one FP32 row of adder's input, and of its output
_names = itertools.count()


def _tensor(name: str, region: str, offset: int) -> dict:
    memory = {
        "shared_memory_region": region,
        "shared_memory_byte_size": VALUES,
        "shared_memory_offset": offset,
    }
    return {"name": name, "parameters": memory}


async def _round(http: httpx.AsyncClient, tally: Outcomes, values: np.ndarray, lie: bool) -> None:
    number = next(_names)
    region, key = f"soak_{os.getpid()}_{number}", f"/reposerve-soak-{os.getpid()}-{number}"
    path = f"/dev/shm{key}"
    descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(descriptor, 2 * VALUES)
        os.pwrite(descriptor, values.tobytes(), 0)
        offset = 4 * VALUES if lie else 0  # past the object's end: a lie
        registration = {"key": key, "offset": offset, "byte_size": 2 * VALUES}
        sent = http.post(f"/v2/systemsharedmemory/region/{region}/register", json=registration)
        reply = await tally.answer(sent, "region registration")
        if reply is None:
            return
        if lie:
            if reply.status_code == 400 and key in reply.text:
                tally.ok("lying region registration refused")
            else:
                tally.problem(f"lying region registration: {reply.status_code} {reply.text[:120]}")
            return
        if reply.status_code != 200:
            tally.problem(f"region registration: {reply.status_code} {reply.text[:120]}")
            return
        await _infer(http, tally, region, descriptor, values)
        sent = http.post(f"/v2/systemsharedmemory/region/{region}/unregister")
        reply = await tally.answer(sent, "region unregister")
        if reply is not None and reply.status_code != 200:
            tally.problem(f"region unregister: {reply.status_code} {reply.text[:120]}")
    finally:
        os.close(descriptor)
        os.unlink(path)


async def _infer(
    http: httpx.AsyncClient, tally: Outcomes, region: str, descriptor: int, values: np.ndarray
) -> None:
    request = {
        "inputs": [{**_tensor("INPUT", region, 0), "shape": [1, 16], "datatype": "FP32"}],
        "outputs": [_tensor("OUTPUT", region, VALUES)],
    }
    reply = await tally.answer(http.post("/v2/models/adder/infer", json=request), "region request")
    if reply is None:
        return
    if reply.status_code != 200:
        tally.failed("request through a region", reply)
        return
    written = np.frombuffer(os.pread(descriptor, VALUES, VALUES), np.float32)
    if np.array_equal(written, values + 1):
        tally.ok("request through a region answered as it should")
    else:
        tally.problem("request through a region answered WRONG")


async def region_client(base: str, running: asyncio.Event, tally: Outcomes, seed: int) -> None:
    rng = np.random.default_rng(seed)
    async with http_client(base) as http:
        while running.is_set():
            values = rng.standard_normal(16).astype(np.float32)
            await _round(http, tally, values, lie=bool(rng.random() < 0.1))
