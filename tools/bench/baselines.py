"""Baseline servers measured beside reposerve in the same run.

- ``starlette_echo``: returns the body it got; the ceiling of our HTTP stack.
- ``fastapi_plus_one``: a plain FastAPI app doing the +1 of the overhead model in-process,
  the way a seed project would, with FastAPI's own JSON handling.
- ``starlette_sse``: the bundled ``text_stream`` model's word-by-word stream done
  in-process as Server-Sent Events: the ceiling of streaming on our HTTP stack.
- ``fastapi_embeddings``: the bundled ``text_embedding`` model's ``model.py`` imported
  into a FastAPI app serving ``POST /v1/embeddings``, each request's texts run at once.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


async def _echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/json")


starlette_echo = Starlette(
    routes=[
        Route("/v2/models/{model}/infer", _echo, methods=["POST"]),
        Route("/v1/embeddings", _echo, methods=["POST"]),
    ]
)


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


def _fastapi_embeddings():
    import numpy as np
    from fastapi import FastAPI

    from tools.bench.openai_routes import load_model_class

    folder = Path(__file__).resolve().parents[2] / "model_repository" / "text_embedding"
    model = load_model_class(folder)()
    model.load(None)
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(request: dict) -> dict:
        texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
        batch = np.array([[text.encode()] for text in texts], dtype=object)
        outputs = model.execute({"text_input": batch})
        tokens = int(outputs["num_input_tokens"].sum())
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": vector.tolist()}
                for index, vector in enumerate(outputs["embedding"])
            ],
            "model": request["model"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return app


def __getattr__(name: str):
    if name == "fastapi_plus_one":
        return _fastapi_app()
    if name == "fastapi_embeddings":
        return _fastapi_embeddings()
    raise AttributeError(name)
