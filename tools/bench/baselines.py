"""Baseline servers measured beside reposerve in the same run.

- ``starlette_echo``: returns the body it got; the ceiling of our HTTP stack.
- ``fastapi_plus_one``: a plain FastAPI app doing the +1 of the overhead model in-process,
  the way a seed project would, with FastAPI's own JSON handling.
- ``starlette_sse``: the bundled ``text_stream`` model's word-by-word stream done
  in-process as Server-Sent Events: the ceiling of streaming on our HTTP stack.
"""

from __future__ import annotations

import asyncio
import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


async def _echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/json")


starlette_echo = Starlette(routes=[Route("/v2/models/{model}/infer", _echo, methods=["POST"])])


async def _words(request: Request) -> StreamingResponse:
    body = json.loads(await request.body())
    words = body["text_input"].split()
    delay = body.get("delay_ms", 0) / 1000

    async def events():
        for index, word in enumerate(words):
            if index:
                await asyncio.sleep(delay)
            text = word if index == len(words) - 1 else word + " "
            yield b"data: " + json.dumps({"text_output": text, "index": index}).encode() + b"\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


starlette_sse = Starlette(
    routes=[Route("/v2/models/{model}/generate_stream", _words, methods=["POST"])]
)


def _fastapi_app():  # imported lazily: FastAPI is a bench-only dependency
    import numpy as np
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: dict) -> dict:
        tensor = request["inputs"][0]
        values = np.asarray(tensor["data"], dtype=np.float32) + 1
        return {
            "model_name": model,
            "outputs": [
                {
                    "name": "OUTPUT",
                    "datatype": "FP32",
                    "shape": tensor["shape"],
                    "data": values.tolist(),
                }
            ],
        }

    return app


def __getattr__(name: str):
    if name == "fastapi_plus_one":
        return _fastapi_app()
    raise AttributeError(name)
