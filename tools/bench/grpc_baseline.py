"""The bare gRPC ceiling: Triton's protocol for one model, +1 on FP32[16] in-process, on
grpcio's asyncio server or on its thread-pool server, and nothing else (no scheduler,
no instance, no checks). perf_analyzer drives it as it drives reposerve, so the two
servers show what grpcio costs per call in either mode, and reposerve's share beyond it.

python -m tools.bench.grpc_baseline aio|threads PORT
"""

from __future__ import annotations

import asyncio
import sys
from concurrent import futures
from typing import Any

import grpc
import numpy as np

from reposerve.grpc import schema

MODEL = "plus_one"
SIZE = 16


def _message(kind: str, **fields: Any) -> Any:
    return schema.message_class(f"{schema.PACKAGE}.{kind}")(**fields)


def _metadata(request: Any) -> Any:
    tensor = {"datatype": "FP32", "shape": [-1, SIZE]}
    return _message(
        "ModelMetadataResponse",
        name=MODEL,
        versions=["1"],
        platform="python",
        inputs=[{"name": "INPUT", **tensor}],
        outputs=[{"name": "OUTPUT", **tensor}],
    )


def _config(request: Any) -> Any:
    tensor = {"data_type": 11, "dims": [SIZE]}  # TYPE_FP32
    return _message(
        "ModelConfigResponse",
        config={
            "name": MODEL,
            "backend": "python",
            "max_batch_size": 64,
            "input": [{"name": "INPUT", **tensor}],
            "output": [{"name": "OUTPUT", **tensor}],
        },
    )


def _infer(request: Any) -> Any:
    values = np.frombuffer(request.raw_input_contents[0], np.float32) + 1
    shape = list(request.inputs[0].shape)
    return _message(
        "ModelInferResponse",
        model_name=MODEL,
        model_version="1",
        id=request.id,
        outputs=[{"name": "OUTPUT", "datatype": "FP32", "shape": shape}],
        raw_output_contents=[values.tobytes()],
    )


HANDLERS = {
    "ServerLive": lambda request: _message("ServerLiveResponse", live=True),
    "ServerReady": lambda request: _message("ServerReadyResponse", ready=True),
    "ModelReady": lambda request: _message("ModelReadyResponse", ready=True),
    "ServerMetadata": lambda request: _message("ServerMetadataResponse", name="baseline"),
    "ModelMetadata": _metadata,
    "ModelConfig": _config,
    "ModelStatistics": lambda request: _message("ModelStatisticsResponse"),
    "ModelInfer": _infer,
}


def _handlers(wrap: Any) -> grpc.GenericRpcHandler:
    methods = {}
    for method, request_name, _, _ in schema.METHODS:
        if method in HANDLERS:
            request_class = schema.message_class(f"{schema.PACKAGE}.{request_name}")
            methods[method] = grpc.unary_unary_rpc_method_handler(
                wrap(HANDLERS[method]),
                request_deserializer=request_class.FromString,
                response_serializer=lambda message: message.SerializeToString(),
            )
    return grpc.method_handlers_generic_handler(schema.SERVICE, methods)


async def _serve_aio(port: int) -> None:
    def wrap(handler: Any) -> Any:
        async def call(request: Any, context: Any) -> Any:
            return handler(request)

        return call

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handlers(wrap),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def _serve_threads(port: int) -> None:
    def wrap(handler: Any) -> Any:
        return lambda request, context: handler(request)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((_handlers(wrap),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def main() -> int:
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "aio":
        asyncio.run(_serve_aio(port))
    else:
        _serve_threads(port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
