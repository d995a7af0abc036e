"""The ``openai`` scenario: the OpenAI-compatible routes against the same models without
a model server.

- Embeddings: the bundled ``text_embedding`` model at concurrency 32, one text per
  request (``POST /v1/embeddings``), on reposerve and in a plain FastAPI app that imports
  the same ``model.py`` and runs it in-process on each request's text (what a seed project
  writes); the bare Starlette echo of the same request is the ceiling of the HTTP stack.
  reposerve's mean batch comes from its statistics.
- Chat: the bundled ``tiny_chat`` generator streaming ``POST /v1/chat/completions`` over
  SSE, one stream at a time and eight side by side: time to the first token and tokens per
  second, against the same generator driven in-process (its ``execute`` iterated in this
  process, no server, no HTTP), which is the ceiling.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import msgspec

from reposerve.tune.load import RunResult, closed_loop, encode_request
from tools.bench import servers
from tools.bench.scenarios import Report

HOST = "127.0.0.1"
CONCURRENCY = 32
STREAMS = (1, 8)
MAX_TOKENS = 48
WORDS = [
    "the",
    "scheduler",
    "joins",
    "requests",
    "into",
    "batches",
    "while",
    "every",
    "model",
    "keeps",
    "its",
    "own",
    "queue",
    "and",
    "instances",
    "answer",
    "from",
    "shared",
    "memory",
]
QUESTION = [{"role": "user", "content": "How does the scheduler form a batch?"}]


def _texts(count: int = 64) -> list[str]:
    return [" ".join(WORDS[i % 7 : i % 7 + 8 + i % 5]) for i in range(count)]


def _embedding_payloads() -> list[bytes]:
    return [
        encode_request(
            HOST,
            "/v1/embeddings",
            msgspec.json.encode(
                {"model": "text_embedding", "input": text, "encoding_format": "float"}
            ),
            {"Content-Type": "application/json"},
        )
        for text in _texts()
    ]


def load_model_class(folder: Path) -> type:
    """The ``Model`` class of a bundled python model, imported from its model.py."""
    spec = importlib.util.spec_from_file_location(f"bench_{folder.name}", folder / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Model


async def _embeddings(root: Path, server_port: int, duration: float) -> tuple[list, dict]:
    fastapi = servers.asgi("fastapi", "tools.bench.baselines:fastapi_embeddings", "uvicorn")
    echo = servers.asgi("starlette echo", "tools.bench.baselines:starlette_echo", "uvicorn")
    facts: dict[str, float] = {}
    results: list[RunResult] = []
    try:
        payloads = _embedding_payloads()
        stats_url = f"http://{HOST}:{server_port}/v2/models/text_embedding/stats"
        before = httpx.get(stats_url).json()["model_stats"][0]
        for label, port in (
            ("reposerve embeddings", server_port),
            ("fastapi embeddings", fastapi.port),
            ("starlette echo", echo.port),
        ):
            run = await closed_loop(label, HOST, port, payloads, CONCURRENCY, duration)
            print(run.line(), flush=True)
            results.append(run)
            facts[f"{label} req/s"] = run.throughput
            if label.startswith("reposerve"):
                after = httpx.get(stats_url).json()["model_stats"][0]
                items = after["inference_count"] - before["inference_count"]
                batches = after["execution_count"] - before["execution_count"]
                facts["reposerve embeddings mean batch"] = items / max(batches, 1)
    finally:
        fastapi.stop()
        echo.stop()
    facts["embeddings reposerve / fastapi"] = (
        facts["reposerve embeddings req/s"] / facts["fastapi embeddings req/s"]
    )
    facts["embeddings reposerve / starlette echo"] = (
        facts["reposerve embeddings req/s"] / facts["starlette echo req/s"]
    )
    return results, facts


async def _stream_chat(client: httpx.AsyncClient, url: str, seed: int) -> tuple[float, int, float]:
    """(seconds to the first token, tokens, seconds in all) of one streamed chat."""
    body = {
        "model": "tiny_chat",
        "messages": QUESTION,
        "max_tokens": MAX_TOKENS,
        "seed": seed,
        "stream": True,
    }
    started = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", url, json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choices = msgspec.json.decode(line[6:])["choices"]
            if choices and choices[0]["delta"].get("content"):
                tokens += 1
                if first is None:
                    first = time.perf_counter() - started
    return first or 0.0, tokens, time.perf_counter() - started


async def _chat_over_http(port: int, streams: int, duration: float) -> dict[str, float]:
    url = f"http://{HOST}:{port}/v1/chat/completions"
    firsts: list[float] = []
    total_tokens = 0
    stop_at = time.perf_counter() + duration
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(worker: int) -> None:
            nonlocal total_tokens
            seed = worker * 100_000
            while time.perf_counter() < stop_at:
                first, tokens, _ = await _stream_chat(client, url, seed)
                firsts.append(first)
                total_tokens += tokens
                seed += 1

        started = time.perf_counter()
        await asyncio.gather(*(one(worker) for worker in range(streams)))
        elapsed = time.perf_counter() - started
    return {"first token p50 (ms)": statistics.median(firsts) * 1000,
            "tokens/s": total_tokens / elapsed, "streams done": len(firsts)}  # fmt: skip


async def _chat_in_process(folder: Path, duration: float) -> dict[str, float]:
    """The generator's ``execute`` iterated here, on the prompt the server renders."""
    from reposerve.config.chat_templates import ChatTemplate, render_chat

    model = load_model_class(folder)()
    model.load(SimpleNamespace(version_path=str(folder / "1")))
    template = ChatTemplate((folder / "chat_template.jinja").read_text())
    prompt = render_chat(template, QUESTION, None).encode()
    firsts: list[float] = []
    total_tokens = 0
    seed = 0
    started = time.perf_counter()
    while time.perf_counter() - started < duration:
        inputs = {
            "text_input": [prompt],
            "sampling_parameters": [msgspec.json.encode({"max_tokens": MAX_TOKENS, "seed": seed})],
            "stream": [True],
        }
        began = time.perf_counter()
        first = None
        async for response in model.execute(inputs):
            if response["text_output"][0]:
                total_tokens += 1
                if first is None:
                    first = time.perf_counter() - began
        firsts.append(first or 0.0)
        seed += 1
    elapsed = time.perf_counter() - started
    return {"first token p50 (ms)": statistics.median(firsts) * 1000,
            "tokens/s": total_tokens / elapsed, "streams done": len(firsts)}  # fmt: skip


async def openai_routes(duration: float) -> Report:
    facts: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="openai-") as folder:
        root = Path(folder)
        for name in ("text_embedding", "tiny_chat"):
            shutil.copytree(servers.ROOT / "model_repository" / name, root / name)
        server = servers.reposerve(root, log_path=root / "server.log")
        try:
            results, embedding_facts = await _embeddings(root, server.port, duration)
            facts.update(embedding_facts)
            for streams in STREAMS:
                measured = await _chat_over_http(server.port, streams, duration)
                for key, value in measured.items():
                    facts[f"chat reposerve streams={streams} {key}"] = value
                print(f"chat reposerve streams={streams}: {measured}", flush=True)
        finally:
            server.stop()
        measured = await _chat_in_process(root / "tiny_chat", duration)
        print(f"chat in-process: {measured}", flush=True)
        for key, value in measured.items():
            facts[f"chat in-process {key}"] = value
    facts["chat reposerve streams=1 / in-process tokens/s"] = (
        facts["chat reposerve streams=1 tokens/s"] / facts["chat in-process tokens/s"]
    )
    return Report("openai", results, facts)
