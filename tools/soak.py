"""Soak: a real server under mixed load, faults and hostile input, for a while.

    python -m tools.soak [--duration 60] [--concurrency 8] [--fault-every 3]

Seven models. ``adder`` answers x + 1 and refuses an item starting with POISON as bad
input (``reposerve.InvalidInput``); ``hangs`` hangs for good on an item starting with 13,
and its execution timeout (1 s) kills and replaces the instance; ``stuck`` hangs with no
timeout and is used only at the end; ``counter`` is decoupled and streams 0..COUNT-1;
``chain`` is an ensemble of one ``adder`` step; ``recurse`` calls itself without end;
``sink`` takes bytes of any length and answers the first.

Clients send good requests (each checked against its exact answer), poisoned ones (a 400
for that request alone, while the rest of its batch is served), hanging ones (a 500
naming the timeout), malformed ones (a 4xx), requests through ``chain``, requests to
``recurse`` (a 500 at the depth limit, at once) and streams over generate_stream (every
response in order, or a fault's error as the last event; some clients leave after two
responses, which cancels the rest). One client sends large gRPC messages (8-32 MiB) to
``sink`` and to a model that does not exist. Meanwhile a fault loop in turn SIGKILLs an
instance, reloads ``adder`` from disk, unloads and loads ``hangs`` again, tries to make
``chain`` call itself (a load override that must be refused as a cycle) and sends a
malformed load override (a 400 naming the field). Then the clients stop: every request
must have had its answer and the pending gauge must read 0. Last, requests are left
queued behind a hung ``stuck`` and the server gets SIGTERM: each must get a JSON error,
and the server must exit 0 within its --exit-timeout-secs.

It passes when nothing was lost (every request has its result, or an error its fault
explains), pending is 0, the front's memory and open descriptors are where they were
after warm-up once the load has stopped, and no instance outlived the server. Exit
status 0 on a pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import signal
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import grpc
import httpx
import numpy as np

from reposerve.grpc import schema
from tools.bench import servers

POISON = 999.0
HANG = 13.0
ADDER = f"""
    from reposerve import InvalidInput

    class Model:
        def execute(self, inputs):
            if (inputs["INPUT"][:, 0] == {POISON}).any():
                raise InvalidInput("an item starts with the poison value {POISON:g}")
            return {{"OUTPUT": inputs["INPUT"] + 1}}
"""
HANGS = f"""
    import time

    class Model:
        def load(self, context):
            self.marker = context.version_path / "HANGING"

        def execute(self, inputs):
            if (inputs["INPUT"][:, 0] == {HANG}).any():
                self.marker.touch()
                while True:
                    time.sleep(1)
            return {{"OUTPUT": inputs["INPUT"]}}
"""
COUNTER = """
    import asyncio
    import numpy as np

    class Model:
        async def execute(self, inputs):
            for index in range(int(inputs["COUNT"][0])):
                await asyncio.sleep(0.005)
                yield {"INDEX": np.array([index], np.int32)}
"""
TENSORS = """
    max_batch_size = 8
    [[input]]
    name = "INPUT"
    datatype = "FP32"
    shape = [16]
    [[output]]
    name = "OUTPUT"
    datatype = "FP32"
    shape = [16]
"""
CONFIGS = {
    "adder": TENSORS + "[[instance_group]]\ncount = 2\n"
    "[dynamic_batching]\nmax_queue_delay_microseconds = 500\n",
    # No dynamic batching: a hung request runs alone, so it costs no neighbour.
    "hangs": TENSORS + "[[instance_group]]\ncount = 2\n[execution]\ntimeout_seconds = 1\n",
    "stuck": TENSORS + "[execution]\ntimeout_seconds = 0\n",
    "counter": """
        [[input]]
        name = "COUNT"
        datatype = "INT32"
        shape = [1]
        [[output]]
        name = "INDEX"
        datatype = "INT32"
        shape = [1]
    """,
}
RECURSE = """
    class Model:
        async def execute(self, inputs):
            return await self.context.infer("recurse", {"INPUT": inputs["INPUT"]})

        def load(self, context):
            self.context = context
"""
SINK = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"][:1]}
"""
CHAIN = (
    'backend = "ensemble"\n'
    + TENSORS
    + '[[step]]\nmodel = "adder"\ninput_map = { INPUT = "INPUT" }\n'
    + 'output_map = { OUTPUT = "OUTPUT" }\n'
)
CONFIGS |= {
    "chain": CHAIN,
    "recurse": TENSORS,
    "sink": """
        max_batch_size = 0
        [[input]]
        name = "INPUT"
        datatype = "UINT8"
        shape = [-1]
        [[output]]
        name = "OUTPUT"
        datatype = "UINT8"
        shape = [1]
    """,
}
CODE = {
    "adder": ADDER,
    "hangs": HANGS,
    "stuck": HANGS,
    "counter": COUNTER,
    "recurse": RECURSE,
    "sink": SINK,
}
# chain's config with a second step that calls chain itself: a cycle, refused at load.
CYCLE = {
    "name": "chain",
    "platform": "ensemble",
    "max_batch_size": 8,
    "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [16]}],
    "ensemble_scheduling": {
        "step": [
            {"model_name": "adder", "model_version": -1, "input_map": {"INPUT": "INPUT"},
             "output_map": {"OUTPUT": "mid"}},
            {"model_name": "chain", "model_version": -1, "input_map": {"INPUT": "mid"},
             "output_map": {"OUTPUT": "OUTPUT"}},
        ]
    },
}  # fmt: skip
# Load overrides of adder that are wrong in their shape, each a 400 naming the field.
MALFORMED_OVERRIDES = [
    {"input": {"name": "INPUT"}},
    {"instance_group": [{"count": "two"}]},
    {"dynamic_batching": 5},
    {"version_policy": "latest"},
    {"max_batch_size": 1.5},
    {"input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [[16]]}]},
]
LARGE_GRPC = (8 << 20, 32 << 20)  # bytes: the large gRPC messages' sizes, at random
BAD_BODIES = [
    b"{",
    b'{"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "FP32", "data": [1]}]}',
    b'{"inputs": [{"name": "NOPE", "shape": [1, 16], "datatype": "FP32", "data": []}]}',
    b'{"inputs": [{"name": "INPUT", "shape": [1, 99999999999], "datatype": "FP32", "data": [1]}]}',
    b'{"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "INT8", "data": [1]}]}',
    b'{"inputs": "x"}',
]
MEMORY_GROWTH_MIB = 20.0  # allowed growth of the front after the first quarter of the run
DESCRIPTOR_GROWTH = 16  # allowed growth of the front's open descriptors, likewise
QUIET_S = 3.0  # after the load: the front reclaims what large messages left behind
WARM_UP_S = 10.0  # the front is warm after a quarter of the run, and not before this
SAMPLE_S = 0.5
EXIT_TIMEOUT_S = 3.0
# Errors a fault explains, and the fault: an instance killed or restarting, a version
# reloaded or unloaded under the request, or the request's instance killed for a hung one.
EXPLAINED = (
    "was killed by SIGKILL",
    "retry shortly",
    "is unloading",
    "was unloaded before this request finished",
    " (UNLOADING)",  # the version, or the model with no other: Triton's not-ready words
    " (UNAVAILABLE): unloaded",
    "ran past execution.timeout_seconds",
)
TIMED_OUT = "did not finish within 1 s (execution.timeout_seconds)"


class Outcomes:
    """What happened: ``seen`` counts every outcome, ``problems`` only those that fail the soak."""

    def __init__(self) -> None:
        self.seen: Counter = Counter()
        self.problems: Counter = Counter()
        self.sent = 0
        self.answered = 0

    def ok(self, outcome: str) -> None:
        self.seen[outcome] += 1

    def problem(self, outcome: str) -> None:
        self.seen[outcome] += 1
        self.problems[outcome] += 1


def _request(values: np.ndarray) -> dict:
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
    explained = [reason for reason in EXPLAINED if reason in text] if status != 200 else []
    if wanted:
        tally.ok(f"{kind} request answered as it should")
    elif explained:
        tally.ok(f"{kind} request failed by a fault: {explained[0]}")
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
    explained = [reason for reason in EXPLAINED if reason in error]
    indices = [event.get("INDEX") for event in events if "error" not in event]
    if indices != list(range(len(indices))):
        tally.problem(f"stream answered WRONG: {indices}")
    elif not error and (len(indices) == count or (leave and len(indices) == 2)):
        tally.ok("stream left after two responses" if leave else "stream answered in full")
    elif explained:
        tally.ok(f"stream ended by a fault: {explained[0]}")
    else:
        tally.problem(f"stream ended with {len(indices)} of {count}: {error[:120]}")


async def _client(base: str, running: asyncio.Event, tally: Outcomes, seed: int) -> None:
    rng = np.random.default_rng(seed)
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
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
            tally.sent += 1
            try:
                response = await http.post(
                    f"/v2/models/{model}/infer", content=content, json=_request(values)
                )
            except httpx.HTTPError as exc:
                tally.problem(f"LOST: {kind} request got no answer ({type(exc).__name__})")
                continue
            tally.answered += 1
            _judge(tally, kind, response, expected)


def _large_message(model: str, size: int) -> bytes:
    request = schema.message_class("inference.ModelInferRequest")(model_name=model)
    request.inputs.add(name="INPUT", datatype="UINT8", shape=[size])
    request.raw_input_contents.append(b"\x07" * size)
    return request.SerializeToString()


async def _large_grpc(port: int, running: asyncio.Event, tally: Outcomes, seed: int) -> None:
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
                elif any(reason in (error.details() or "") for reason in EXPLAINED):
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


async def _refused_override(http: httpx.AsyncClient, tally: Outcomes, fault: int) -> None:
    """A load override that must be refused (a cycle, a malformed config), harming nothing."""
    if fault == 3:
        model, config, why, label = "chain", CYCLE, "circular dependency", "cycle"
    else:
        fields = random.choice(MALFORMED_OVERRIDES)
        model, config, why, label = "adder", {"name": "adder", **fields}, "", "malformed"
    body = {"parameters": {"config": json.dumps(config)}}
    response = await http.post(f"/v2/repository/models/{model}/load", json=body)
    if response.status_code == 400 and why in response.text and "Traceback" not in response.text:
        tally.ok(f"fault: {label} override refused")
    else:
        tally.problem(
            f"fault: {label} override answered {response.status_code} {response.text[:120]}"
        )


async def _faults(
    server: servers.Launched, root: Path, running: asyncio.Event, every: float, tally: Outcomes
) -> None:
    base = f"http://127.0.0.1:{server.port}"
    step = 0
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        while running.is_set():
            await asyncio.sleep(every)
            if not running.is_set():
                return
            fault = step % 5
            step += 1
            if fault == 0:
                pids = [
                    pid
                    for pid in servers.children_of(server.process.pid)
                    if _runs(pid, b"reposerve.instance.worker")  # not a front process
                ]
                if pids:
                    os.kill(random.choice(pids), signal.SIGKILL)
                    tally.ok("fault: instance killed")
                continue
            if fault >= 3:
                await _refused_override(http, tally, fault)
                continue
            if fault == 1:
                (root / "adder" / "1" / "model.py").write_text(textwrap.dedent(ADDER))
                steps = [("load", "adder", "model reloaded")]
            else:
                steps = [("unload", "hangs", "model unloaded"), ("load", "hangs", "model loaded")]
            for action, model, done in steps:
                response = await http.post(f"/v2/repository/models/{model}/{action}")
                if response.status_code == 200:
                    tally.ok(f"fault: {done}")
                else:
                    tally.problem(f"fault: {action} {model} failed: {response.text[:120]}")


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _memory(
    server: servers.Launched, running: asyncio.Event, samples: list[tuple[float, int]]
) -> None:
    pid = server.process.pid
    while running.is_set():
        samples.append((servers.pss_mib(pid), _descriptors(pid)))
        await asyncio.sleep(SAMPLE_S)


async def _pending(http: httpx.AsyncClient) -> dict[str, float]:
    """The pending-request gauge of every model, from /metrics."""
    text = (await http.get("/metrics")).text
    gauges = {}
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{"):
            labels, value = line.rsplit(" ", 1)
            gauges[labels.split('model="', 1)[1].split('"', 1)[0]] = float(value)
    return gauges


async def _sigterm_finale(
    server: servers.Launched, root: Path, metrics: httpx.AsyncClient, tally: Outcomes
) -> None:
    """Requests queued behind a hung execute, then SIGTERM: each gets a JSON error in time."""
    base = f"http://127.0.0.1:{server.port}"
    hung = np.zeros((1, 16), np.float32)
    hung[0, 0] = HANG
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        calls = [http.post("/v2/models/stuck/infer", json=_request(hung))]
        sent = [asyncio.ensure_future(calls[0])]
        while not (root / "stuck" / "1" / "HANGING").exists():
            await asyncio.sleep(0.02)
        sent += [
            asyncio.ensure_future(http.post("/v2/models/stuck/infer", json=_request(hung * 0)))
            for _ in range(3)
        ]
        while (await _pending(metrics)).get("stuck", 0) < 3:
            await asyncio.sleep(0.02)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*sent, return_exceptions=True)
        code = await asyncio.to_thread(server.process.wait, 60)
        elapsed = time.monotonic() - started
    tally.sent += len(sent)
    for answer in answers:
        if isinstance(answer, BaseException):
            tally.problem(f"LOST: queued at SIGTERM, no answer ({type(answer).__name__})")
            continue
        tally.answered += 1
        if answer.status_code == 503 and "was unloaded before this request finished" in answer.text:
            tally.ok("queued at SIGTERM: JSON error in time")
        else:
            tally.problem(f"queued at SIGTERM: {answer.status_code} {answer.text[:120]}")
    if code != 0 or elapsed > EXIT_TIMEOUT_S + 3:
        tally.problem(f"SIGTERM: exit {code} after {elapsed:.1f} s (budget {EXIT_TIMEOUT_S:g} s)")
    else:
        tally.ok("SIGTERM: exit 0 within the budget")


def _write_repository(root: Path) -> None:
    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.toml").write_text(textwrap.dedent(config))
        if name in CODE:  # an ensemble has no code
            (root / name / "1" / "model.py").write_text(textwrap.dedent(CODE[name]))


def _runs(pid: int, module: bytes) -> bool:
    try:
        return module in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return False


async def soak(
    duration: float, concurrency: int, fault_every: float, flags: Sequence[str] = ()
) -> bool:
    """``flags``: more of reposerve's (``--http-workers 2``, say)."""
    tally = Outcomes()
    memory: list[tuple[float, int]] = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "repository"
        _write_repository(root)
        metrics_port, grpc_port = servers.free_port(), servers.free_port()
        server = servers.reposerve(
            root,
            *("--allow-metrics", "true", "--metrics-port", str(metrics_port)),
            *("--grpc-port", str(grpc_port)),
            *("--exit-timeout-secs", str(EXIT_TIMEOUT_S)),
            *flags,
            log_path=Path(folder) / "server.log",
        )
        instances = set(servers.children_of(server.process.pid))
        running = asyncio.Event()
        running.set()
        base = f"http://127.0.0.1:{server.port}"
        metrics = httpx.AsyncClient(base_url=f"http://127.0.0.1:{metrics_port}", timeout=30)
        try:
            load = asyncio.gather(
                *(_client(base, running, tally, seed) for seed in range(concurrency)),
                _large_grpc(grpc_port, running, tally, concurrency),
                _faults(server, root, running, fault_every, tally),
                _memory(server, running, memory),
            )
            await asyncio.sleep(duration)
            instances |= set(servers.children_of(server.process.pid))
            running.clear()
            await load  # each client ends with an answer to its last request
            await asyncio.sleep(QUIET_S)
            settled = (servers.pss_mib(server.process.pid), _descriptors(server.process.pid))
            pending = await _pending(metrics)
            print(f"pending after the load: {pending}")
            if any(pending.values()):
                tally.problem("pending gauge not 0 once every request was answered")
            instances |= set(servers.children_of(server.process.pid))
            await _sigterm_finale(server, root, metrics, tally)
        finally:
            await metrics.aclose()
            server.stop()
    orphans = [pid for pid in instances if Path(f"/proc/{pid}").exists()]
    for outcome, count in sorted(tally.seen.items()):
        print(f"{count:8d}  {outcome}")
    # The lowest a few seconds past the warm-up: large messages come and go under load.
    warm_at = min(int(max(duration / 4, WARM_UP_S) / SAMPLE_S), max(len(memory) - 1, 0))
    window = memory[warm_at : warm_at + 10] or [settled]
    warm = (min(sample[0] for sample in window), min(sample[1] for sample in window))
    growth = settled[0] - warm[0]
    more_descriptors = settled[1] - warm[1]
    peak = max(sample[0] for sample in memory) if memory else settled[0]
    lost = tally.sent - tally.answered
    print(f"requests: {tally.sent} sent, {tally.answered} answered, {lost} lost")
    print(
        f"front memory (PSS): {warm[0]:.1f} -> {settled[0]:.1f} MiB after warm-up (peak "
        f"{peak:.1f}); descriptors: {warm[1]} -> {settled[1]}; orphans: {len(orphans)}"
    )
    answered_well = tally.seen["good request answered as it should"]
    passed = (
        not tally.problems
        and not lost
        and answered_well > 0
        and growth < MEMORY_GROWTH_MIB
        and more_descriptors <= DESCRIPTOR_GROWTH
        and not orphans
    )
    print("soak: PASS" if passed else "soak: FAIL")
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (60)")
    parser.add_argument("--concurrency", type=int, default=8, help="clients (8)")
    parser.add_argument("--fault-every", type=float, default=3.0, help="seconds between faults (3)")
    parser.add_argument(
        "--server-args",
        default="",
        help="more reposerve flags, as one string (e.g. '--http-workers 2 --grpc-workers 2')",
    )
    args = parser.parse_args()
    flags = shlex.split(args.server_args)
    passed = asyncio.run(soak(args.duration, args.concurrency, args.fault_every, flags))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
