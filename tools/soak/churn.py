"""On-demand churn: a second server loads models on first use within a host memory budget
that holds three of its four models, so requests keep evicting and loading them.

``pair`` is an ensemble of two of them (``w0`` then ``w1``): it and its steps must become
resident as one unit, so its requests never fail because a neighbour's load made room.
Meanwhile a client asks for models the repository does not hold, under long names: each
is a 404, and none may cost the server memory past its request.
"""

from __future__ import annotations

import asyncio
import random
import string
import textwrap
from pathlib import Path

import numpy as np

from tools.bench import servers
from tools.soak.outcomes import Outcomes, http_client

HOLDER = """
    import numpy as np

    class Model:
        def load(self, context):
            self.weights = np.ones(40 << 20, np.uint8)  # resident: it counts in the budget
            self.scale = context.config.parameters["scale"]

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] * self.scale + 1}
"""
TENSORS = """
    max_batch_size = 8
    [[input]]
    name = "INPUT"
    datatype = "FP32"
    shape = [4]
    [[output]]
    name = "OUTPUT"
    datatype = "FP32"
    shape = [4]
"""
SCALES = {"w0": 1.0, "w1": 2.0, "w2": 3.0, "w3": 4.0}
PAIR = (
    'backend = "ensemble"\n'
    + textwrap.dedent(TENSORS)
    + '[[step]]\nmodel = "w0"\ninput_map = { INPUT = "INPUT" }\noutput_map = { OUTPUT = "mid" }\n'
    + '[[step]]\nmodel = "w1"\ninput_map = { INPUT = "mid" }\noutput_map = { OUTPUT = "OUTPUT" }\n'
)
BUDGET = "230M"  # three holders (about 70 MB each, interpreter included), not four
FLAGS = ("--model-control-mode", "on-demand", "--host-memory-budget", BUDGET)
UNKNOWN_NAME_BYTES = 8 << 10


def write_repository(root: Path) -> None:
    for name, scale in SCALES.items():
        (root / name / "1").mkdir(parents=True)
        config = textwrap.dedent(TENSORS) + f"[parameters]\nscale = {scale}\n"
        (root / name / "config.toml").write_text(config)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(HOLDER))
    (root / "pair" / "1").mkdir(parents=True)
    (root / "pair" / "config.toml").write_text(PAIR)


def start(folder: Path) -> servers.Launched:
    root = folder / "churn-repository"
    write_repository(root)
    return servers.reposerve(root, *FLAGS, log_path=folder / "churn.log")


def _expected(model: str, values: np.ndarray) -> np.ndarray:
    if model == "pair":
        return (values + 1) * SCALES["w1"] + 1
    return values * SCALES[model] + 1


async def churn_client(base: str, running: asyncio.Event, tally: Outcomes, seed: int) -> None:
    """Requests to the four models and the ensemble, at random: each answer exact."""
    rng = np.random.default_rng(seed)
    models = [*SCALES, "pair"]
    async with http_client(base, timeout=120) as http:
        while running.is_set():
            model = models[int(rng.integers(len(models)))]
            values = rng.standard_normal((1, 4)).astype(np.float32)
            tensor = {"name": "INPUT", "shape": [1, 4], "datatype": "FP32"}
            body = {"inputs": [{**tensor, "data": values.ravel().tolist()}]}
            kind = "ensemble" if model == "pair" else "on-demand"
            reply = await tally.answer(http.post(f"/v2/models/{model}/infer", json=body), kind)
            if reply is None:
                continue
            if reply.status_code != 200:  # no fault here: a neighbour's load is no excuse
                tally.problem(f"{kind} request {reply.status_code} {reply.text[:160]}")
                continue
            data = np.array(reply.json()["outputs"][0]["data"], np.float32).reshape(1, 4)
            if np.allclose(data, _expected(model, values)):
                tally.ok(f"{kind} request answered as it should")
            else:
                tally.problem(f"{kind} request answered WRONG")


async def unknown_names_client(base: str, running: asyncio.Event, tally: Outcomes) -> None:
    """Requests naming models that do not exist, each name new and long: a 404 each."""
    letters = string.ascii_letters + string.digits
    async with http_client(base) as http:
        while running.is_set():
            name = "".join(random.choices(letters, k=UNKNOWN_NAME_BYTES))
            sent = http.post(f"/v2/models/{name}/infer", json={"inputs": []})
            reply = await tally.answer(sent, "unknown model name")
            if reply is None:
                continue
            if reply.status_code == 404:
                tally.ok("unknown model name answered 404")
            else:
                tally.problem(f"unknown model name: {reply.status_code} {reply.text[:400]}")
