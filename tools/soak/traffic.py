"""The main load: clients of adder, hangs, chain, recurse and counter, and large gRPC
messages to sink and to a model that does not exist."""

from __future__ import annotations

import asyncio
import json
import random

import grpc
import httpx
import numpy as np

from reposerve.grpc import schema
from tools.soak.outcomes import TIMED_OUT, Outcomes, explained, http_client
from tools.soak.repository import HANG, POISON

LARGE_GRPC = (8 << 20, 32 << 20)  # bytes: the large gRPC messages' sizes, at random
BAD_BODIES = [
    b"{",
    b'{"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "FP32", "data": [1]}]}',
    b'{"inputs": [{"name": "NOPE", "shape": [1, 16], "datatype": "FP32", "data": []}]}',
    b'{"inputs": [{"name": "INPUT", "shape": [1, 99999999999], "datatype": "FP32", "data": [1]}]}',
    b'{"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "INT8", "data": [1]}]}',
    b'{"inputs": "x"}',
]


def request_body(values: np.ndarray) -> dict:
    tensor = {"name": "INPUT", "shape": list(values.shape), "datatype": "FP32"}
    return {"inputs": [{**tensor, "data": values.ravel().tolist()}]}


def _judge(tally: Outcomes, kind: str, response: httpx.Response, expected: np.ndarray | None):
    """Sort one answer: what it should be for ``kind``, explained by a fault, or a problem."""
    status, text = response.status_code, response.text
    if kind == "malformed":
        wanted = 400 <= status < 500
    elif kind == "poisoned":
        wanted = status == 400 and "poison value" in text
    elif kind == "hanging":
        wanted = status == 500 and TIMED_OUT in text
    elif kind == "recursive":
        wanted = status == 500 and "beyond the limit of" in text
    else:
        wanted = status == 200
        if wanted:
            data = np.array(response.json()["outputs"][0]["data"], np.float32)
            if not np.array_equal(data.reshape(expected.shape), expected):
                tally.problem(f"{kind} request answered WRONG")
                return
    reason = explained(text) if status != 200 else ""
    if wanted:
        tally.ok(f"{kind} request answered as it should")
    elif reason:
        tally.ok(f"{kind} request failed by a fault: {reason}")
    else:
        tally.problem(f"{kind} request answered {status} {text[:120]}")


async def _stream(http: httpx.AsyncClient, tally: Outcomes, count: int, leave: bool) -> None:
    """One generate_stream call to ``counter``: in full, or (``leave``) left after two."""
    tally.sent += 1
    events: list[dict] = []
    line = ""
    try:
        async with http.stream(
            "POST", "/v2/models/counter/generate_stream", json={"COUNT": count}
        ) as reply:
            if reply.status_code != 200:  # an error, as JSON or as one SSE event
                line = (await reply.aread()).decode(errors="replace").strip()
                events.append(json.loads(line.removeprefix("data: ")))
            else:
                async for line in reply.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[len("data: ") :]))
                    if leave and len(events) == 2:
                        break
    except (httpx.HTTPError, ValueError) as exc:
        tally.problem(f"LOST: stream got no answer ({type(exc).__name__}: {line[:80]!r})")
        return
    tally.answered += 1
    error = events[-1].get("error", "") if events else "no response at all"
    reason = explained(error)
    indices = [event.get("INDEX") for event in events if "error" not in event]
    if indices != list(range(len(indices))):
        tally.problem(f"stream answered WRONG: {indices}")
    elif not error and (len(indices) == count or (leave and len(indices) == 2)):
        tally.ok("stream left after two responses" if leave else "stream answered in full")
    elif reason:
        tally.ok(f"stream ended by a fault: {reason}")
    else:
        tally.problem(f"stream ended with {len(indices)} of {count}: {error[:120]}")


async def client(base: str, running: asyncio.Event, tally: Outcomes, seed: int) -> None:
    rng = np.random.default_rng(seed)
    async with http_client(base) as http:
        while running.is_set():
            roll = rng.random()
            if roll > 0.9:
                count = int(rng.integers(3, 40))
                await _stream(http, tally, count, leave=bool(rng.random() < 0.3))
                continue
            batch = int(rng.integers(1, 4))
            values = rng.standard_normal((batch, 16)).astype(np.float32)
            model, expected, content = "adder", values + 1, None
            if roll < 0.15:
                kind, content = "malformed", BAD_BODIES[int(rng.integers(len(BAD_BODIES)))]
            elif roll < 0.25:
                kind = "poisoned"
                values[int(rng.integers(batch)), 0] = POISON
            elif roll < 0.28:
                kind, model = "hanging", "hangs"
                values[0, 0] = HANG
            elif roll < 0.30:
                kind, model = "recursive", "recurse"
            elif roll < 0.36:
                kind, model = "good", "chain"
            elif roll < 0.45:
                kind, model, expected = "good", "hangs", values
            else:
                kind = "good"
            sent = http.post(
                f"/v2/models/{model}/infer", content=content, json=request_body(values)
            )
            response = await tally.answer(sent, f"{kind} request")
            if response is None:
                continue
            _judge(tally, kind, response, expected)


def _large_message(model: str, size: int) -> bytes:
    request = schema.message_class("inference.ModelInferRequest")(model_name=model)
    request.inputs.add(name="INPUT", datatype="UINT8", shape=[size])
    request.raw_input_contents.append(b"\x07" * size)
    return request.SerializeToString()


async def large_grpc(port: int, running: asyncio.Event, tally: Outcomes, seed: int) -> None:
    """Large ModelInfer messages, answered (``sink``) or refused (no such model)."""
    rng = random.Random(seed)
    options = [("grpc.max_send_message_length", 2**31 - 1)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_unary(f"/{schema.SERVICE}/ModelInfer")
        # The largest first: sink's slot grows to its size during the warm-up.
        size = LARGE_GRPC[1]
        while running.is_set():
            model = "sink" if size == LARGE_GRPC[1] else rng.choice(("sink", "no_such_model"))
            data = _large_message(model, size)
            size = rng.randint(*LARGE_GRPC)
            tally.sent += 1
            try:
                answer = await call(data, timeout=60)
            except grpc.aio.AioRpcError as error:
                tally.answered += 1
                if model != "sink" and error.code() == grpc.StatusCode.NOT_FOUND:
                    tally.ok("large gRPC message refused: no such model")
                elif explained(error.details() or ""):
                    tally.ok("large gRPC message failed by a fault")
                else:
                    tally.problem(f"large gRPC message: {error.code()} {error.details()[:120]}")
                continue
            tally.answered += 1
            response = schema.message_class("inference.ModelInferResponse").FromString(answer)
            if model == "sink" and response.raw_output_contents[0] == b"\x07":
                tally.ok("large gRPC message answered as it should")
            else:
                tally.problem("large gRPC message answered WRONG")
            await asyncio.sleep(0.2)
