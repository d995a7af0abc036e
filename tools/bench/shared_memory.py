"""The ``shared-memory`` scenario: tensors by reference (Triton's system shared-memory
extension) against tensors in the message, binary HTTP and gRPC, on an identity model.

Two workloads: one 3x224x224 FP32 image (batch 1, 588 KiB) and one 64 MiB FP32 tensor.
Each goes, in the same run and the same server, through:

- ``shm http`` / ``shm grpc``: input and output in regions registered once, one pair per
  client; the request carries only their names (the closed loop hands each client the
  payloads in turn, so two requests may use one pair at once: that changes no cost)
- ``http binary``: the tensor in the body, the output in the response (the reference)
- ``grpc``: raw_input_contents and raw_output_contents
- ``starlette echo``: a bare Starlette app on uvicorn returning the binary request's body,
  the ceiling of the HTTP stack for moving those bytes in and out

gRPC load runs in a process of its own (``python -m tools.bench.shared_memory grpc ...``,
as ``tools.bench.protocols`` does), its requests serialised once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import textwrap
import urllib.request
from multiprocessing import shared_memory
from pathlib import Path

import msgspec
import numpy as np

from reposerve.tune.load import RunResult, closed_loop, encode_request
from reposerve.tune.requests import binary_request
from tools.bench import servers
from tools.bench.protocols import grpc_closed_loop
from tools.bench.scenarios import HOST, Report

# (label, model, shape with the batch dimension, max_batch_size)
WORKLOADS = (
    ("image 3x224x224", "image_identity", [1, 3, 224, 224], 8),
    ("tensor 64 MiB", "tensor_identity", [16 << 20], 0),
)
CONCURRENCIES = (1, 4)
IDENTITY = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"]}
"""
# Room for the 64 MiB tensor and its request's JSON header (the default is 64 MiB).
MAX_INPUT = str(256 << 20)


def _config(shape: list[int], max_batch: int) -> str:
    dims = shape[1:] if max_batch else shape
    return textwrap.dedent(f"""
        max_batch_size = {max_batch}
        [[input]]
        name = "INPUT"
        datatype = "FP32"
        shape = {dims}
        [[output]]
        name = "OUTPUT"
        datatype = "FP32"
        shape = {dims}
    """)


def _place(region: str, nbytes: int) -> dict:
    return {"shared_memory_region": region, "shared_memory_byte_size": nbytes}


def _shm_http_payload(model: str, shape: list[int], nbytes: int, client: int) -> bytes:
    body = msgspec.json.encode(
        {
            "inputs": [
                {"name": "INPUT", "shape": shape, "datatype": "FP32",
                 "parameters": _place(f"{model}-in-{client}", nbytes)}
            ],
            "outputs": [{"name": "OUTPUT", "parameters": _place(f"{model}-out-{client}", nbytes)}],
        }
    )  # fmt: skip
    path = f"/v2/models/{model}/infer"
    return encode_request(HOST, path, body, {"Content-Type": "application/json"})


def grpc_payloads(model: str, shape: list[int], shared: bool, count: int) -> list[bytes]:
    """Serialised ModelInferRequests: the tensor in raw_input_contents, or (``shared``)
    input and output placed in client ``i``'s regions."""
    from reposerve.grpc import schema

    request_class = schema.message_class(f"{schema.PACKAGE}.ModelInferRequest")
    nbytes = int(np.prod(shape)) * 4
    rng = np.random.default_rng(0)
    payloads = []
    for client in range(count):
        request = request_class(model_name=model)
        tensor = request.inputs.add(name="INPUT", datatype="FP32", shape=shape)
        output = request.outputs.add(name="OUTPUT")
        if shared:
            for entry, kind in ((tensor, "in"), (output, "out")):
                entry.parameters["shared_memory_region"].string_param = f"{model}-{kind}-{client}"
                entry.parameters["shared_memory_byte_size"].int64_param = nbytes
        else:
            raw = rng.standard_normal(nbytes // 4).astype(np.float32).tobytes()
            request.raw_input_contents.append(raw)
        payloads.append(request.SerializeToString())
    return payloads


class _Regions:
    """Each client's input and output region for each model, registered with the server."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._made: list[shared_memory.SharedMemory] = []

    def make(self, model: str, nbytes: int, clients: int) -> None:
        rng = np.random.default_rng(0)
        for client in range(clients):
            for kind in ("in", "out"):
                memory = shared_memory.SharedMemory(create=True, size=nbytes)
                self._made.append(memory)
                if kind == "in":
                    values = np.ndarray((nbytes // 4,), np.float32, memory.buf)
                    values[:] = rng.standard_normal(nbytes // 4)
                    del values  # no view may outlive the region's close
                self._post(
                    f"/v2/systemsharedmemory/region/{model}-{kind}-{client}/register",
                    {"key": f"/{memory.name}", "offset": 0, "byte_size": nbytes},
                )

    def close(self) -> None:
        self._post("/v2/systemsharedmemory/unregister", None)
        for memory in self._made:
            memory.close()
            memory.unlink()

    def _post(self, path: str, body: dict | None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        url = f"http://{HOST}:{self._port}{path}"
        with urllib.request.urlopen(urllib.request.Request(url, data, method="POST")) as reply:
            reply.read()


async def _grpc_run(
    label: str, address: str, model: str, shape: list[int], shared: bool, concurrency: int,
    duration: float,
) -> RunResult:  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tools.bench.shared_memory", "grpc", "--address", address,
        "--model", model, "--shape", ",".join(map(str, shape)), "--concurrency",
        str(concurrency), "--duration", str(duration), "--label", label,
        *(["--shared"] if shared else []),
        stdout=asyncio.subprocess.PIPE, cwd=servers.ROOT,
    )  # fmt: skip
    output, _ = await process.communicate()
    if process.returncode:
        raise RuntimeError(f"the gRPC load client failed with code {process.returncode}")
    return msgspec.json.decode(output, type=RunResult)


async def shared_memory_scenario(
    duration: float, concurrencies: tuple[int, ...] = CONCURRENCIES
) -> Report:
    results: list[RunResult] = []
    facts: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for _, model, shape, max_batch in WORKLOADS:
            (root / model / "1").mkdir(parents=True)
            (root / model / "config.toml").write_text(_config(shape, max_batch))
            (root / model / "1" / "model.py").write_text(textwrap.dedent(IDENTITY))
        grpc_port = servers.free_port()
        server = servers.reposerve(
            root, "--grpc-port", str(grpc_port), "--allow-client-shm", "true",
            "--http-max-input-size", MAX_INPUT,
        )  # fmt: skip
        echo = servers.asgi("starlette echo", "tools.bench.baselines:starlette_echo", "uvicorn")
        regions = _Regions(server.port)
        grpc_address = f"{HOST}:{grpc_port}"
        try:
            for name, model, shape, _ in WORKLOADS:
                nbytes = int(np.prod(shape)) * 4
                regions.make(model, nbytes, max(concurrencies))
                raw = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
                binary = [
                    binary_request([("INPUT", "FP32", shape, raw.tobytes())], ["OUTPUT"]).payload(
                        HOST, model
                    )
                ]
                del raw
                for concurrency in concurrencies:
                    shm_http = [
                        _shm_http_payload(model, shape, nbytes, client)
                        for client in range(concurrency)
                    ]
                    runs = [
                        await closed_loop(f"{name} shm http", HOST, server.port, shm_http,
                                          concurrency, duration),
                        await _grpc_run(f"{name} shm grpc", grpc_address, model, shape, True,
                                        concurrency, duration),
                        await closed_loop(f"{name} http binary", HOST, server.port, binary,
                                          concurrency, duration),
                        await _grpc_run(f"{name} grpc", grpc_address, model, shape, False,
                                        concurrency, duration),
                        await closed_loop(f"{name} starlette echo", HOST, echo.port, binary,
                                          concurrency, duration),
                    ]  # fmt: skip
                    for run in runs:
                        print(run.line(), flush=True)
                    results += runs
                    reference = runs[2]
                    for run in (runs[0], runs[1], runs[3], runs[4]):
                        transport = run.label.removeprefix(f"{name} ")
                        key = f"{name} c={concurrency} {transport} / http binary"
                        facts[f"{key} req/s"] = run.throughput / max(reference.throughput, 1e-9)
                        facts[f"{key} p50"] = run.p50_ms / max(reference.p50_ms, 1e-9)
                del binary
        finally:
            regions.close()
            server.stop()
            echo.stop()
    return Report("shared-memory", results, facts)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.shared_memory")
    parser.add_argument("kind", choices=["grpc"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--shape", required=True, help="D1,D2,... with the batch dimension")
    parser.add_argument("--shared", action="store_true", help="tensors in client i's regions")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--label", default="grpc")
    args = parser.parse_args()
    shape = [int(dim) for dim in args.shape.split(",")]
    payloads = grpc_payloads(args.model, shape, args.shared, args.concurrency if args.shared else 1)
    result = asyncio.run(
        grpc_closed_loop(args.label, args.address, payloads, args.concurrency, args.duration)
    )
    sys.stdout.buffer.write(msgspec.json.encode(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
