"""The ``variable-length`` scenario: requests of every length to a text encoder, batched with
padding and buckets, against today's batching, which joins only requests of one shape.

The model is a small transformer encoder, ``torch.nn.TransformerEncoder``: 2 layers, width
64, 4 heads, random weights, nothing downloaded. It takes token ids and an attention mask,
and it answers each token's hidden state (HIDDEN) and their masked mean (EMBEDDING). It is
exported to ONNX by torch's dynamo exporter (the legacy one bakes the example's sequence
length into the attention's reshapes). One server serves it twice:

- ``encoder_padded``: ``pad = { INPUT_IDS = 0, ATTENTION_MASK = 0 }``, ``buckets`` and
  ``unpad = { HIDDEN = "INPUT_IDS" }``, so requests of different lengths share a batch;
- ``encoder_exact``: the same dynamic batching without padding, so a batch holds requests
  of one length only, as every peer does it, and nearly every request runs alone.

Both get the same requests at concurrency 32, with lengths drawn from 8-512: uniformly,
and log-uniformly (most texts are short). Before the runs, every request's answer from
the padded model under concurrency, HIDDEN and EMBEDDING, is checked against the same
request run alone (``encoder_exact`` one at a time). The largest difference is reported
and must stay within float tolerance, else the run fails.
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
import textwrap
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import numpy as np

from reposerve.tune.load import RunResult, closed_loop, encode_request
from tools.bench import servers
from tools.bench.scenarios import Report

HOST = "127.0.0.1"
WIDTH = 64
VOCAB = 1000
SHORTEST, LONGEST = 8, 512
# Past 128 tokens a batch of 8 costs more per row than its rows alone on a 2-core CPU
# (measured with onnxruntime, see the README): longer requests run alone.
BUCKETS = [16, 32, 64, 128]
CONCURRENCY = 32
TOLERANCE = 1e-4  # float32, one op order against another
CONFIG = """
    backend = "onnxruntime"
    max_batch_size = 32
    [[input]]
    name = "INPUT_IDS"
    datatype = "INT64"
    shape = [-1]
    [[input]]
    name = "ATTENTION_MASK"
    datatype = "INT64"
    shape = [-1]
    [[output]]
    name = "HIDDEN"
    datatype = "FP32"
    shape = [-1, 64]
    [[output]]
    name = "EMBEDDING"
    datatype = "FP32"
    shape = [64]
    [dynamic_batching]
    max_queue_delay_microseconds = 2000
"""
PADDING = f"""
    pad = {{ INPUT_IDS = 0, ATTENTION_MASK = 0 }}
    buckets = {BUCKETS}
    unpad = {{ HIDDEN = "INPUT_IDS" }}
"""


def export_encoder(path: Path) -> None:
    """The encoder with random weights (seeded), as ONNX at ``path``."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = torch.nn.Embedding(VOCAB, WIDTH)
            self.positions = torch.nn.Embedding(LONGEST, WIDTH)
            layer = torch.nn.TransformerEncoderLayer(
                WIDTH, 4, 2 * WIDTH, dropout=0.0, batch_first=True
            )
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple:
            positions = torch.arange(ids.shape[1]).unsqueeze(0)
            tokens = self.tokens(ids) + self.positions(positions)
            hidden = self.encoder(tokens, src_key_padding_mask=mask == 0)
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            return hidden, (hidden * weights).sum(1) / weights.sum(1)

    torch.manual_seed(0)
    example = (torch.randint(1, VOCAB, (2, 16)), torch.ones(2, 16, dtype=torch.int64))
    batch, length = torch.export.Dim("batch", max=64), torch.export.Dim("length", max=LONGEST)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Encoder().eval(),
            example,
            str(path),
            input_names=["INPUT_IDS", "ATTENTION_MASK"],
            output_names=["HIDDEN", "EMBEDDING"],
            dynamic_shapes=({0: batch, 1: length}, {0: batch, 1: length}),
            dynamo=True,
            external_data=False,  # one file: the weights are a few MB
            verbose=False,
        )


def _repository(root: Path) -> None:
    export_encoder(root / "encoder_padded" / "1" / "model.onnx")
    (root / "encoder_exact" / "1").mkdir(parents=True)
    (root / "encoder_exact" / "1" / "model.onnx").write_bytes(
        (root / "encoder_padded" / "1" / "model.onnx").read_bytes()
    )
    (root / "encoder_padded" / "config.toml").write_text(textwrap.dedent(CONFIG + PADDING))
    (root / "encoder_exact" / "config.toml").write_text(textwrap.dedent(CONFIG))


def lengths(count: int, spread: str, seed: int = 11) -> list[int]:
    """Request lengths in [SHORTEST, LONGEST]: uniform, or log-uniform."""
    rng = np.random.default_rng(seed)
    if spread == "uniform":
        return rng.integers(SHORTEST, LONGEST + 1, count).tolist()
    drawn = np.exp(rng.uniform(math.log(SHORTEST), math.log(LONGEST + 1), count))
    return np.minimum(drawn.astype(int), LONGEST).tolist()


def _body(length: int, seed: int, outputs: list[str]) -> bytes:
    ids = np.random.default_rng(seed).integers(1, VOCAB, length).tolist()
    tensor = {"shape": [1, length], "datatype": "INT64"}
    return msgspec.json.encode(
        {
            "inputs": [
                {"name": "INPUT_IDS", **tensor, "data": ids},
                {"name": "ATTENTION_MASK", **tensor, "data": [1] * length},
            ],
            "outputs": [{"name": name} for name in outputs],
        }
    )


def _answer(url: str, model: str, body: bytes) -> dict[str, np.ndarray]:
    reply = httpx.post(f"{url}/v2/models/{model}/infer", content=body, timeout=120)
    reply.raise_for_status()
    return {
        out["name"]: np.array(out["data"], np.float32).reshape(out["shape"])
        for out in reply.json()["outputs"]
    }


def check_answers(url: str, count: int = 48) -> float:
    """The largest difference between the padded model's answers under concurrency and
    the same requests run alone, one at a time; raises when past tolerance or when an
    answer's shape differs."""
    bodies = [
        _body(length, seed, ["HIDDEN", "EMBEDDING"])
        for seed, length in enumerate(lengths(count, "uniform", seed=5))
    ]
    alone = [_answer(url, "encoder_exact", body) for body in bodies]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda body: _answer(url, "encoder_padded", body), bodies))
    worst = 0.0
    for reference, answer in zip(alone, together, strict=True):
        for name, expected in reference.items():
            if answer[name].shape != expected.shape:
                raise AssertionError(f"{name}: {answer[name].shape} != {expected.shape} alone")
            worst = max(worst, float(np.abs(answer[name] - expected).max()))
    if worst > TOLERANCE:
        raise AssertionError(f"padded answers differ from alone by {worst} > {TOLERANCE}")
    return worst


def _stats(port: int, model: str) -> dict:
    url = f"http://{HOST}:{port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url) as reply:
        return json.loads(reply.read())["model_stats"][0]


async def variable_length(duration: float) -> Report:
    with tempfile.TemporaryDirectory(prefix="variable-length-") as folder:
        root = Path(folder)
        await asyncio.to_thread(_repository, root)
        server = servers.reposerve(root, log_path=root / "server.log")
        try:
            return await _run(server.port, duration)
        finally:
            server.stop()


async def _run(port: int, duration: float) -> Report:
    url = f"http://{HOST}:{port}"
    worst = await asyncio.to_thread(check_answers, url)
    results: list[RunResult] = []
    facts: dict[str, float] = {"max_abs_difference_from_alone": worst}
    for spread in ("uniform", "log-uniform"):
        drawn = lengths(256, spread)
        runs = {}
        for model in ("encoder_padded", "encoder_exact"):
            before = _stats(port, model)
            payloads = [
                encode_request(
                    HOST,
                    f"/v2/models/{model}/infer",
                    _body(length, seed, ["EMBEDDING"]),
                    {"Content-Type": "application/json"},
                )
                for seed, length in enumerate(drawn)
            ]
            label = f"{model} {spread}"
            run = await closed_loop(label, HOST, port, payloads, CONCURRENCY, duration)
            print(run.line(), flush=True)
            results.append(run)
            runs[model] = run
            after = _stats(port, model)
            items = after["inference_count"] - before["inference_count"]
            batches = after["execution_count"] - before["execution_count"]
            facts[f"{label} mean_batch"] = items / max(batches, 1)
            if model == "encoder_padded":
                padded = after["padding_stats"]
                elements = padded["elements"] - before["padding_stats"]["elements"]
                padding = padded["padding"] - before["padding_stats"]["padding"]
                facts[f"{label} padding_share"] = padding / max(elements, 1)
        facts[f"{spread} speedup"] = runs["encoder_padded"].throughput / max(
            runs["encoder_exact"].throughput, 1e-9
        )
    return Report("variable-length", results, facts)
