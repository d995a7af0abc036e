"""Variable-length batching through a real server and tritonclient: requests of different
lengths share a padded batch, the model gets each one's length, outputs are cut back, and
every answer is what the request gets alone."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from tests.server import SERVE_BROKEN, running_server
from tests.toy_models import write_model

pytestmark = pytest.mark.e2e

# TOKENS (INT64, [-1]) padded with 0; the model answers SCORES = TOKENS * 2 (FP32, [-1], cut
# back) and TOTAL = the sum of the tokens over the length it was told (FP32, [1]), and
# writes down each batch's shape, lengths and padded tokens.
CONFIG = """
    max_batch_size = 8
    [[input]]
    name = "TOKENS"
    datatype = "INT64"
    shape = [-1]
    [[output]]
    name = "SCORES"
    datatype = "FP32"
    shape = [-1]
    [[output]]
    name = "TOTAL"
    datatype = "FP32"
    shape = [1]
    [dynamic_batching]
    max_queue_delay_microseconds = 200000
    pad = { TOKENS = 0 }
    lengths_input = "LENGTHS"
    unpad = { SCORES = "TOKENS" }
    EXTRA
"""

NATIVE = """
    import json
    import numpy as np

    class Model:
        def load(self, context):
            self.log = context.version_path / "BATCHES"

        def execute(self, inputs):
            tokens, lengths = inputs["TOKENS"], inputs["LENGTHS"]
            assert lengths.dtype == np.int32 and lengths.shape == (len(tokens), 1)
            with open(self.log, "a") as log:
                log.write(json.dumps({"shape": tokens.shape, "lengths": lengths[:, 0].tolist(),
                                      "tokens": tokens.tolist()}) + "\\n")
            keep = np.arange(tokens.shape[1])[None, :] < lengths
            total = np.where(keep, tokens, 0).sum(axis=1, keepdims=True)
            return {"SCORES": (tokens * 2).astype(np.float32),
                    "TOTAL": total.astype(np.float32)}
"""

# The same in Triton's python-backend shape: each request's own tensors, padded.
TRITON = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.log = f"{args['model_repository']}/{args['model_version']}/BATCHES"

        def execute(self, requests):
            responses = []
            shapes = []
            for request in requests:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS").as_numpy()
                lengths = pb_utils.get_input_tensor_by_name(request, "LENGTHS").as_numpy()
                shapes.append({"shape": tokens.shape, "lengths": lengths[:, 0].tolist()})
                keep = np.arange(tokens.shape[1])[None, :] < lengths
                total = np.where(keep, tokens, 0).sum(axis=1, keepdims=True)
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("SCORES", (tokens * 2).astype(np.float32)),
                    pb_utils.Tensor("TOTAL", total.astype(np.float32)),
                ]))
            with open(self.log, "a") as log:
                log.write(json.dumps({"requests": shapes}) + "\\n")
            return responses
"""


def _model(root: Path, name: str, code: str, extra: str = "") -> Path:
    return write_model(root, name, CONFIG.replace("EXTRA", extra), code)


def _batches(folder: Path) -> list[dict]:
    lines = (folder / "1" / "BATCHES").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _infer(client: triton.InferenceServerClient, model: str, tokens: np.ndarray) -> dict:
    request = triton.InferInput("TOKENS", list(tokens.shape), "INT64")
    request.set_data_from_numpy(tokens)
    result = client.infer(model, [request])
    return {name: result.as_numpy(name) for name in ("SCORES", "TOTAL")}


def _concurrently(url: str, model: str, requests: list[np.ndarray]) -> list[dict]:
    client = triton.InferenceServerClient(url.removeprefix("http://"), concurrency=16)
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda tokens: _infer(client, model, tokens), requests))


def _expected(tokens: np.ndarray) -> dict:
    return {
        "SCORES": (tokens * 2).astype(np.float32),
        "TOTAL": tokens.sum(axis=1, keepdims=True).astype(np.float32),
    }


def _check(answers: list[dict], requests: list[np.ndarray]) -> None:
    for answer, tokens in zip(answers, requests, strict=True):
        expected = _expected(tokens)
        for name in ("SCORES", "TOTAL"):
            assert answer[name].shape == expected[name].shape, (name, tokens.shape)
            np.testing.assert_array_equal(answer[name], expected[name])


LENGTHS = [3, 7, 5, 12, 1, 9]


def _requests(lengths=LENGTHS) -> list[np.ndarray]:
    return [np.arange(1, n + 1, dtype=np.int64)[None, :] + 100 * i for i, n in enumerate(lengths)]


def test_requests_of_different_lengths_share_a_padded_batch(tmp_path):
    folder = _model(tmp_path / "repository", "native", NATIVE)
    with running_server(tmp_path / "repository", tmp_path) as server:
        requests = _requests()
        _check(_concurrently(server.url, "native", requests), requests)
        batches = _batches(folder)
        stats = httpx.get(f"{server.url}/v2/models/native/stats").json()["model_stats"][0]
        metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    assert max(len(batch["lengths"]) for batch in batches) > 1  # they did share
    for batch in batches:  # padded to the longest in the batch, with 0, lengths given
        rows, width = batch["shape"]
        assert width == max(batch["lengths"])
        for row, length in zip(batch["tokens"], batch["lengths"], strict=True):
            assert all(token == 0 for token in row[length:]) and 0 not in row[:length]
    padding = stats["padding_stats"]
    elements = sum(b["shape"][0] * b["shape"][1] for b in batches)
    assert padding == {
        "batches": len(batches),
        "elements": elements,
        "padding": elements - sum(LENGTHS),
    }
    assert (
        f'reposerve_padding_elements{{model="native",version="1"}} {elements - sum(LENGTHS)}'
        in (metrics)
    )


def test_buckets_pad_to_the_next_and_a_request_past_the_largest_runs_alone(tmp_path):
    folder = _model(tmp_path / "repository", "bucketed", NATIVE, "buckets = [4, 8]")
    with running_server(tmp_path / "repository", tmp_path) as server:
        requests = _requests([2, 3, 6, 7, 11, 1])
        _check(_concurrently(server.url, "bucketed", requests), requests)
    batches = _batches(folder)
    for batch in batches:
        longest = max(batch["lengths"])
        if longest > 8:  # past the largest bucket: alone, as long as it is
            assert batch["lengths"] == [11] and batch["shape"] == [1, 11]
        else:  # one bucket per batch, padded to it
            assert batch["shape"][1] == (4 if longest <= 4 else 8)
            assert all((n <= 4) == (longest <= 4) for n in batch["lengths"])
    assert sorted(n for batch in batches for n in batch["lengths"]) == [1, 2, 3, 6, 7, 11]
    assert max(len(batch["lengths"]) for batch in batches) > 1


def test_a_triton_python_model_sees_each_request_padded(tmp_path):
    folder = _model(tmp_path / "repository", "triton_style", TRITON)
    with running_server(tmp_path / "repository", tmp_path) as server:
        requests = _requests()
        _check(_concurrently(server.url, "triton_style", requests), requests)
    batches = _batches(folder)
    shared = [batch["requests"] for batch in batches if len(batch["requests"]) > 1]
    assert shared, batches
    for requests_seen in shared:
        widths = {seen["shape"][1] for seen in requests_seen}
        assert widths == {max(seen["lengths"][0] for seen in requests_seen)}


ENSEMBLE = """
    max_batch_size = 8
    backend = "ensemble"
    [[input]]
    name = "IDS"
    datatype = "INT64"
    shape = [-1]
    [[output]]
    name = "DOUBLED"
    datatype = "FP32"
    shape = [-1]
    [[step]]
    model = "native"
    input_map = { TOKENS = "IDS" }
    output_map = { SCORES = "DOUBLED" }
"""


def test_an_ensemble_step_pads_and_cuts_back(tmp_path):
    root = tmp_path / "repository"
    step = _model(root, "native", NATIVE)
    write_model(root, "pipeline", ENSEMBLE, None)
    with running_server(root, tmp_path) as server:
        client = triton.InferenceServerClient(server.url.removeprefix("http://"), concurrency=8)

        def run(tokens: np.ndarray) -> np.ndarray:
            request = triton.InferInput("IDS", list(tokens.shape), "INT64")
            request.set_data_from_numpy(tokens)
            return client.infer("pipeline", [request]).as_numpy("DOUBLED")

        requests = _requests()
        with ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(run, requests))
    for answer, tokens in zip(answers, requests, strict=True):
        np.testing.assert_array_equal(answer, (tokens * 2).astype(np.float32))
    assert max(len(batch["lengths"]) for batch in _batches(step)) > 1  # the step batched


def test_the_lengths_input_is_the_models_not_the_clients(tmp_path):
    _model(tmp_path / "repository", "native", NATIVE)
    with running_server(tmp_path / "repository", tmp_path) as server:
        metadata = httpx.get(f"{server.url}/v2/models/native").json()
        config = httpx.get(f"{server.url}/v2/models/native/config").json()
        sent = httpx.post(
            f"{server.url}/v2/models/native/infer",
            json={
                "inputs": [
                    {"name": "TOKENS", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]},
                    {"name": "LENGTHS", "datatype": "INT32", "shape": [1, 1], "data": [9]},
                ]
            },
        )
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["TOKENS"]
    assert [tensor["name"] for tensor in config["input"]] == ["TOKENS"]
    assert json.loads(config["parameters"]["reposerve.dynamic_batching.pad"]["string_value"]) == {
        "TOKENS": 0
    }
    assert sent.status_code == 400 and "LENGTHS" in sent.json()["error"]


TOKEN_NET = """
    backend = "BACKEND"
    max_batch_size = 8
    [[input]]
    name = "ids"
    datatype = "INT64"
    shape = [-1]
    [[input]]
    name = "mask"
    datatype = "INT64"
    shape = [-1]
    [[output]]
    name = "hidden"
    datatype = "FP32"
    shape = [-1, 8]
    [[output]]
    name = "pooled"
    datatype = "FP32"
    shape = [8]
    [dynamic_batching]
    max_queue_delay_microseconds = 200000
    pad = { ids = 0, mask = 0 }
    unpad = { hidden = "ids" }
"""


@pytest.mark.parametrize(
    ("backend", "file"), [("onnxruntime", "model.onnx"), ("torch", "model.pt")]
)
def test_onnxruntime_and_torch_models_answer_as_alone(tmp_path, backend, file):
    model_files = pytest.importorskip("tests.model_files")
    root = tmp_path / "repository"
    write_model(root, "tokens", TOKEN_NET.replace("BACKEND", backend), None)
    model_files.export_token_net(root / "tokens" / "1" / file)
    requests = [np.random.default_rng(n).integers(1, 50, (1, n), dtype=np.int64) for n in LENGTHS]
    with running_server(root, tmp_path) as server:
        client = triton.InferenceServerClient(server.url.removeprefix("http://"), concurrency=8)

        def run(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            tensors = [
                triton.InferInput(name, list(ids.shape), "INT64") for name in ("ids", "mask")
            ]
            tensors[0].set_data_from_numpy(ids)
            tensors[1].set_data_from_numpy(np.ones_like(ids))
            result = client.infer("tokens", tensors)
            return result.as_numpy("hidden"), result.as_numpy("pooled")

        with ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(run, requests))
        stats = httpx.get(f"{server.url}/v2/models/tokens/stats").json()["model_stats"][0]
    assert stats["execution_count"] < len(requests)  # some of them shared a batch
    assert stats["padding_stats"]["padding"] > 0
    for (hidden, pooled), ids in zip(answers, requests, strict=True):
        want_hidden, want_pooled = model_files.token_reference(ids)
        assert hidden.shape == want_hidden.shape == (1, ids.shape[1], 8)
        np.testing.assert_allclose(hidden, want_hidden, atol=1e-5)
        np.testing.assert_allclose(pooled, want_pooled, atol=1e-5)


# GRID (FP32, [-1, -1]) padded with 0 to buckets along both dims; DOUBLED = GRID * 2, cut
# back along both.
GRID = """
    max_batch_size = 8
    [[input]]
    name = "GRID"
    datatype = "FP32"
    shape = [-1, -1]
    [[output]]
    name = "DOUBLED"
    datatype = "FP32"
    shape = [-1, -1]
    [dynamic_batching]
    max_queue_delay_microseconds = 200000
    pad = { GRID = 0 }
    buckets = BUCKETS
    unpad = { DOUBLED = "GRID" }
"""

DOUBLING = """
    class Model:
        def execute(self, inputs):
            return {"DOUBLED": inputs["GRID"] * 2}
"""


def test_every_padded_dim_is_cut_back_and_absurd_buckets_never_load(tmp_path):
    root = tmp_path / "repository"
    write_model(root, "grid", GRID.replace("BUCKETS", "[4, 8]"), DOUBLING)
    write_model(root, "absurd", GRID.replace("BUCKETS", "[8, 1099511627776]"), DOUBLING)
    shapes = [(3, 5), (2, 7), (4, 4), (1, 8), (3, 5)]
    grids = [
        np.arange(1, rows * cols + 1, dtype=np.float32).reshape(1, rows, cols)
        for rows, cols in shapes
    ]
    with running_server(root, tmp_path, *SERVE_BROKEN) as server:
        client = triton.InferenceServerClient(server.url.removeprefix("http://"), concurrency=8)

        def run(grid: np.ndarray) -> np.ndarray:
            request = triton.InferInput("GRID", list(grid.shape), "FP32")
            request.set_data_from_numpy(grid)
            return client.infer("grid", [request]).as_numpy("DOUBLED")

        with ThreadPoolExecutor(len(grids)) as pool:
            answers = list(pool.map(run, grids))
        stats = httpx.get(f"{server.url}/v2/models/grid/stats").json()["model_stats"][0]
        index = httpx.post(f"{server.url}/v2/repository/index", json={}).json()
        refused = httpx.post(
            f"{server.url}/v2/models/absurd/infer",
            json={
                "inputs": [{"name": "GRID", "datatype": "FP32", "shape": [1, 1, 1], "data": [1]}]
            },
        )
    assert len(answers) == len(grids)  # an answer for every request sent
    for answer, grid in zip(answers, grids, strict=True):
        assert answer.shape == grid.shape  # 3x5 answers 3x5, not 3x8 with zeros
        np.testing.assert_array_equal(answer, grid * 2)
    assert stats["padding_stats"]["padding"] > 0  # the buckets padded them
    # The config is refused when it loads, naming the file, the key and the reason; a
    # request to it is told the model is not there to serve, never a 500.
    (absurd,) = [entry for entry in index if entry["name"] == "absurd"]
    assert absurd["state"] == "UNAVAILABLE"
    assert (
        "absurd/config.toml: dynamic_batching.buckets: a batch of 8 padded to the largest"
        in (absurd["reason"])
    )
    assert refused.status_code != 500 and "absurd" in refused.json()["error"]
