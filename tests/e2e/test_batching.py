"""Dynamic batching through the real server: no cross-talk under concurrency, batches
that form under load, and instance groups placed and budgeted as configured."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server import SERVE_BROKEN, running_server, start_server
from tests.toy_models import PLUS_ONE, SLOW, vector_config, write_model

pytestmark = pytest.mark.e2e

THREADS = """
    import os
    import numpy as np

    class Model:
        def load(self, context):
            self.report = [
                context.threads,
                int(os.environ["OMP_NUM_THREADS"]),
                len(os.environ.get("CUDA_VISIBLE_DEVICES", "unset")),
            ]

        def execute(self, inputs):
            batch = inputs["INPUT"].shape[0]
            return {"OUTPUT": np.tile(np.array(self.report, np.int64), (batch, 1))}
"""


def _threads_config(groups: str, parameters: str = "") -> str:
    extra = f"{groups}\n{parameters}"
    return vector_config(size=1, max_batch=4, output=("INT64", 3), extra=extra)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    batching = "[dynamic_batching]\nmax_queue_delay_microseconds = 2000"
    write_model(root, "plus_one", vector_config(max_batch=8, extra=batching), PLUS_ONE)
    write_model(
        root,
        "plus_one_2",
        vector_config(extra=f"{batching}\n[[instance_group]]\ncount = 2"),
        PLUS_ONE,
    )
    write_model(root, "slow", vector_config(size=4, extra="[dynamic_batching]"), SLOW)
    write_model(root, "slow_alone", vector_config(size=4), SLOW)
    write_model(root, "threads", _threads_config("[[instance_group]]\ncount = 2"), THREADS)
    write_model(
        root,
        "threads_pinned",
        _threads_config('[[instance_group]]\nkind = "auto"', "[parameters]\nintra_op_threads = 3"),
        THREADS,
    )
    write_model(root, "wants_gpu", _threads_config('[[instance_group]]\nkind = "gpu"'), THREADS)
    server = start_server(root, tmp_path_factory.mktemp("log"), *SERVE_BROKEN)
    yield server
    assert server.stop() == 0, server.log()


def _body(values: np.ndarray) -> dict:
    return {
        "inputs": [
            {
                "name": "INPUT",
                "shape": list(values.shape),
                "datatype": "FP32",
                "data": values.ravel().tolist(),
            }
        ]
    }


async def _send_all(url: str, model: str, batches: list[np.ndarray]) -> list[np.ndarray]:
    limits = httpx.Limits(max_connections=len(batches))
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        responses = await asyncio.gather(
            *(client.post(f"/v2/models/{model}/infer", json=_body(values)) for values in batches)
        )
    results = []
    for response in responses:
        assert response.status_code == 200, response.text
        output = response.json()["outputs"][0]
        results.append(np.array(output["data"], np.float32).reshape(output["shape"]))
    return results


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(["plus_one", "plus_one_2"]))
def test_concurrent_requests_get_exactly_their_own_results(server, seed, model):
    rng = np.random.default_rng(seed)
    batches = [
        rng.standard_normal((int(rng.integers(1, 5)), 16)).astype(np.float32) for _ in range(200)
    ]
    results = asyncio.run(_send_all(server.url, model, batches))
    for values, result in zip(batches, results, strict=True):
        np.testing.assert_allclose(result, values + 1, rtol=1e-6)


def _batch_sizes(url: str, model: str) -> dict[int, int]:
    stats = httpx.get(f"{url}/v2/models/{model}/stats").json()["model_stats"][0]
    return {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats["batch_stats"]}


def test_slow_model_batches_under_load(server):
    batches = [np.full((1, 4), i, np.float32) for i in range(32)]
    results = asyncio.run(_send_all(server.url, "slow", batches))
    for values, result in zip(batches, results, strict=True):
        np.testing.assert_array_equal(result, values * 2)
    sizes = _batch_sizes(server.url, "slow")
    assert max(sizes) > 1, sizes
    assert sum(size * count for size, count in sizes.items()) == 32
    # 32 requests arriving together at a model that takes 50 ms: while one batch runs the
    # rest queue up, so far fewer executions than requests.
    assert sum(sizes.values()) <= 16, sizes
    # Without [dynamic_batching] every request runs alone.
    asyncio.run(_send_all(server.url, "slow_alone", batches[:8]))
    assert _batch_sizes(server.url, "slow_alone") == {1: 8}


def _report(url: str, model: str) -> list[int]:
    response = httpx.post(
        f"{url}/v2/models/{model}/infer", json=_body(np.zeros((1, 1), np.float32))
    )
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def test_cpu_instances_share_the_cores(server):
    import os

    cores = len(os.sched_getaffinity(0))
    threads, omp, cuda_visible_length = _report(server.url, "threads")
    assert threads == omp == max(1, cores // 2)
    assert cuda_visible_length == 0  # CPU instances see no GPU


def test_parameters_override_the_thread_budget_and_auto_falls_back(server):
    from reposerve.repository.gpus import discover

    if discover().visible:
        pytest.skip("a GPU is visible: kind auto places this model on it")
    assert _report(server.url, "threads_pinned")[:2] == [3, 3]


def test_gpu_group_without_gpu_is_a_load_error(server):
    from reposerve.repository.gpus import discover

    if discover().visible:
        pytest.skip("a GPU is visible here")
    index = httpx.post(f"{server.url}/v2/repository/index").json()
    entry = next(e for e in index if e["name"] == "wants_gpu")
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].startswith(
        "model 'wants_gpu': instance_group[0] asks for kind \"gpu\" but no GPU is visible"
    )


def test_priority_and_timeout_parameters_reach_the_scheduler(server):
    body = _body(np.zeros((1, 16), np.float32))
    body["parameters"] = {"priority": 1}
    response = httpx.post(f"{server.url}/v2/models/plus_one/infer", json=body)
    assert response.status_code == 400
    assert "parameter priority needs dynamic_batching.priority_levels" in response.json()["error"]
    body["parameters"] = {"timeout": 10_000_000}
    response = httpx.post(
        f"{server.url}/v2/models/plus_one/infer", content=msgspec.json.encode(body)
    )
    assert response.status_code == 200


# Notes each row it runs (its first value) in EXECUTED, then holds a batch holding a 1
# until GO appears (STARTED says it is held).
GATED_RECORDS = """
    import time

    class Model:
        def load(self, context):
            self.folder = context.version_path

        def execute(self, inputs):
            values = inputs["INPUT"][:, 0]
            with (self.folder / "EXECUTED").open("a") as log:
                log.write("".join(f"{value:g}\\n" for value in values))
            if 1 in values:
                (self.folder / "STARTED").touch()
                while not (self.folder / "GO").exists():
                    time.sleep(0.01)
            return {"OUTPUT": inputs["INPUT"] * 2}
"""


def _wait(predicate: Callable[[], bool], limit: float = 20.0) -> bool:
    """Whether ``predicate`` came true before ``limit`` seconds (a hang detector)."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _pending(server, model: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    found = re.search(
        rf'^nv_inference_pending_request_count{{model="{model}",.*}} (\S+)$', text, re.M
    )
    return float(found[1]) if found else 0.0


def test_a_request_that_times_out_behind_a_running_batch_never_runs(repository, tmp_path):
    """Behind a held batch, a full batch forms from a request with a 5 s timeout and one
    without (the instance could take it as its next, staged): the first times out and
    never runs, the other runs once the instance is free, with the rest of the queue."""
    folder = write_model(
        repository, "gated", vector_config(size=2, max_batch=2, extra="[dynamic_batching]"),
        GATED_RECORDS,
    )  # fmt: skip
    version = folder / "1"
    with running_server(repository, tmp_path) as server, ThreadPoolExecutor(8) as pool:

        def send(value: float, timeout_us: int | None) -> httpx.Response:
            body = _body(np.full((1, 2), value, np.float32))
            if timeout_us is not None:
                body["parameters"] = {"timeout": timeout_us}
            return httpx.post(f"{server.url}/v2/models/gated/infer", json=body, timeout=120)

        sent = {1.0: pool.submit(send, 1.0, None)}
        assert _wait(lambda: (version / "STARTED").exists())
        # One at a time, each queued before the next (well within the 5 s): 10 and 20 make
        # the full batch.
        for value, timeout_us in ((10.0, 5_000_000), (20.0, None), (30.0, 5_000_000), (40.0, None)):
            sent[value] = pool.submit(send, value, timeout_us)
            assert _wait(lambda: _pending(server, "gated") >= len(sent) - 1)
        # Both time out while the first batch is held (a hang detector bounds the wait).
        _wait(lambda: sent[10.0].done() and sent[30.0].done())
        (version / "GO").touch()
        answers = {value: future.result() for value, future in sent.items()}
    for value in (10.0, 30.0):
        assert answers[value].status_code == 503, answers[value].text
        assert "timed out in the queue" in answers[value].json()["error"]
    for value in (1.0, 20.0, 40.0):
        assert answers[value].status_code == 200, answers[value].text
    executed = sorted(float(line) for line in (version / "EXECUTED").read_text().split())
    assert executed == [1.0, 20.0, 40.0]
