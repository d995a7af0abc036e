"""Sequences on a stateful model, with clients that give up on theirs.

``tally`` keeps each sequence's running sum as implicit state on 4 slots of one instance.
A sequence client sends a START and a few more requests, the last with END, and checks
every sum. An abandoning client sends a START and leaves after a moment, closing its
connection: while every slot is held its START waits in the backlog, and leaving must
withdraw it (it never takes a slot); a START answered before it leaves opens a sequence
nobody continues, which the idle timeout releases.
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np

from tools.soak.outcomes import Outcomes, http_client

MODEL = "tally"
CONFIG = """
    max_batch_size = 4
    [[input]]
    name = "INPUT"
    datatype = "FP32"
    shape = [1]
    [[output]]
    name = "SUM"
    datatype = "FP32"
    shape = [1]
    [sequence_batching]
    max_sequence_idle_microseconds = 5_000_000
    [[sequence_batching.control_input]]
    name = "START"
    kind = "start"
    [[sequence_batching.state]]
    input_name = "SUM_IN"
    output_name = "SUM_OUT"
    datatype = "FP32"
    shape = [1]
"""
CODE = """
    import time

    class Model:
        def execute(self, inputs):
            time.sleep(0.002)  # a sequence holds its slot a while
            total = inputs["SUM_IN"] + inputs["INPUT"]
            return {"SUM": total, "SUM_OUT": total}
"""
PATIENCE_S = 0.05  # how long an abandoning client waits for its START
ABANDON_EVERY_S = 0.5
_ids = itertools.count(1)


def _body(sequence: int, value: float, start: bool, end: bool) -> dict:
    tensor = {"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [value]}
    flags = {"sequence_id": sequence, "sequence_start": start, "sequence_end": end}
    return {"inputs": [tensor], "parameters": flags}


async def sequence_client(base: str, running: asyncio.Event, tally: Outcomes, seed: int) -> None:
    """Whole sequences, each sum checked; one that a fault ends is started anew."""
    rng = np.random.default_rng(seed)
    url = f"/v2/models/{MODEL}/infer"
    async with http_client(base) as http:
        while running.is_set():
            sequence, total = next(_ids), 0.0
            length = int(rng.integers(2, 8))
            for step in range(length):
                value = float(rng.integers(1, 100))
                body = _body(sequence, value, start=step == 0, end=step == length - 1)
                reply = await tally.answer(http.post(url, json=body), "sequence request")
                if reply is None:
                    break
                if reply.status_code != 200:
                    tally.failed("sequence request", reply)
                    break
                total += value
                if reply.json()["outputs"][0]["data"] != [total]:
                    tally.problem("sequence answered WRONG")
                    break
            else:
                tally.ok("sequence answered in full")


async def abandoning_client(base: str, running: asyncio.Event, tally: Outcomes) -> None:
    """STARTs whose client leaves before its answer: what they cost is checked at the end
    (pending back to 0, every whole sequence still served)."""
    while running.is_set():
        await asyncio.sleep(ABANDON_EVERY_S)
        # A client of its own: leaving closes its connection, as a user's process would.
        async with http_client(base) as http:
            body = _body(next(_ids), 1.0, start=True, end=False)
            answer = http.post(f"/v2/models/{MODEL}/infer", json=body)
            try:
                await asyncio.wait_for(answer, PATIENCE_S)
            except TimeoutError:
                tally.ok("sequence START abandoned while it waited")
            else:
                tally.ok("sequence START answered, then abandoned")
