"""Ensembles served by a real server: a diamond pipeline gives what calling its models by
hand gives, its steps are batched across ensemble requests, its statistics and its steps'
are reported, a step reloaded under load costs no request, and an unloaded step takes the
ensemble out of service with the reason until it is loaded again."""

from __future__ import annotations

import textwrap
import threading

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.probes import stats
from tests.server import SERVE_BROKEN, running_server, start_server
from tests.toy_models import XY_CONFIG, XY_DOUBLE, XY_PLUS_ONE, ensemble_head, write_model

pytestmark = pytest.mark.e2e


JOIN = """
    class Model:
        def execute(self, inputs):
            return {"SUM": inputs["A"] + inputs["B"]}
"""
JOIN_CONFIG = """
    max_batch_size = 16
    [[input]]
    name = "A"
    datatype = "FP32"
    shape = [4]
    [[input]]
    name = "B"
    datatype = "FP32"
    shape = [4]
    [[output]]
    name = "SUM"
    datatype = "FP32"
    shape = [4]
    [dynamic_batching]
    max_queue_delay_microseconds = 20000
"""
ENSEMBLE_HEAD = ensemble_head(16)
# One input, two branches (plus_one, double) that run at once, and a join.
DIAMOND = (
    ENSEMBLE_HEAD
    + """
    [[step]]
    model = "join"
    input_map = { A = "plus", B = "doubled" }
    output_map = { SUM = "OUT" }
    [[step]]
    model = "plus_one"
    input_map = { X = "IN" }
    output_map = { Y = "plus" }
    [[step]]
    model = "double"
    input_map = { X = "IN" }
    output_map = { Y = "doubled" }
"""
)


def _write_diamond(repository) -> None:
    write_model(repository, "plus_one", XY_CONFIG, XY_PLUS_ONE)
    write_model(repository, "double", XY_CONFIG, XY_DOUBLE)
    write_model(repository, "join", JOIN_CONFIG, JOIN)
    write_model(repository, "diamond", DIAMOND, None)


def _infer(client, model: str, values: np.ndarray, name: str = "IN", out: str = "OUT"):
    tensor = httpclient.InferInput(name, list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return client.infer(model, [tensor]).as_numpy(out)


@pytest.fixture
def diamond_server(repository, tmp_path):
    _write_diamond(repository)
    server = start_server(repository, tmp_path)
    yield server
    assert server.stop() == 0, server.log()


def test_a_diamond_gives_what_its_models_give_by_hand_and_batches_its_steps(diamond_server):
    client = httpclient.InferenceServerClient(diamond_server.address, concurrency=16)
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    plus = _infer(client, "plus_one", values, "X", "Y")
    doubled = _infer(client, "double", values, "X", "Y")
    joined = httpclient.InferInput("A", [2, 4], "FP32")
    joined.set_data_from_numpy(plus)
    other = httpclient.InferInput("B", [2, 4], "FP32")
    other.set_data_from_numpy(doubled)
    by_hand = client.infer("join", [joined, other]).as_numpy("SUM")
    np.testing.assert_array_equal(_infer(client, "diamond", values), by_hand)
    config = client.get_model_config("diamond")
    assert config["platform"] == "ensemble"
    assert [step["model_name"] for step in config["ensemble_scheduling"]["step"]] == [
        "join", "plus_one", "double",
    ]  # fmt: skip

    before = stats(diamond_server, "join")
    requests = [np.full((1, 4), index, np.float32) for index in range(32)]
    calls = []
    for x in requests:
        tensor = httpclient.InferInput("IN", [1, 4], "FP32")
        tensor.set_data_from_numpy(x)
        calls.append(client.async_infer("diamond", [tensor]))
    for x, call in zip(requests, calls, strict=True):
        np.testing.assert_array_equal(call.get_result().as_numpy("OUT"), (x + 1) + x * 2)
    join = stats(diamond_server, "join")
    served = join["inference_count"] - before["inference_count"]
    executions = join["execution_count"] - before["execution_count"]
    assert served == 32 and executions < 32  # ensemble calls shared batches at the join
    ensemble = stats(diamond_server, "diamond")
    assert ensemble["inference_stats"]["success"]["count"] == 33
    for step in ("plus_one", "double"):
        assert stats(diamond_server, step)["inference_stats"]["success"]["count"] == 34
    metrics = httpx.get(f"http://127.0.0.1:{diamond_server.metrics_port}/metrics").text
    assert 'nv_inference_request_success{model="diamond",version="1"} 33' in metrics


def test_a_step_reloaded_under_load_fails_no_ensemble_request(diamond_server, repository):
    stop = threading.Event()
    outcomes: list[str] = []

    def load() -> None:
        client = httpclient.InferenceServerClient(diamond_server.address)
        x = np.ones((1, 4), np.float32)
        while not stop.is_set():
            try:
                answer = _infer(client, "diamond", x)
                outcomes.append("ok" if np.array_equal(answer, x + 1 + x * 2) else "wrong")
            except Exception as exc:  # noqa: BLE001 - every failure counts against the test
                outcomes.append(f"failed: {exc}")

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(2):
            (repository / "double" / "1" / "model.py").write_text(textwrap.dedent(XY_DOUBLE))
            reply = httpx.post(f"{diamond_server.url}/v2/repository/models/double/load")
            assert reply.status_code == 200, reply.text
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert len(outcomes) > 20
    assert set(outcomes) == {"ok"}, [o for o in outcomes if o != "ok"][:3]


def test_an_unloaded_step_takes_the_ensemble_out_with_the_reason(diamond_server):
    base = diamond_server.url
    assert httpx.post(f"{base}/v2/repository/models/double/unload").status_code == 200
    index = {entry["name"]: entry for entry in httpx.post(f"{base}/v2/repository/index").json()}
    assert index["diamond"]["state"] == "UNAVAILABLE"
    assert "step model 'double' was unloaded" in index["diamond"]["reason"]
    assert httpx.get(f"{base}/v2/models/diamond/ready").status_code == 400
    body = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
    refused = httpx.post(f"{base}/v2/models/diamond/infer", json=body)
    assert refused.status_code == 404 and "double" in refused.json()["error"]
    # Loading the step brings the ensemble back.
    assert httpx.post(f"{base}/v2/repository/models/double/load").status_code == 200
    assert httpx.get(f"{base}/v2/models/diamond/ready").status_code == 200
    assert httpx.post(f"{base}/v2/models/diamond/infer", json=body).status_code == 200
    # unload_dependents (Triton's): an ensemble's step models go with it.
    reply = httpx.post(
        f"{base}/v2/repository/models/diamond/unload",
        json={"parameters": {"unload_dependents": True}},
    )
    assert reply.status_code == 200
    index = {entry["name"]: entry for entry in httpx.post(f"{base}/v2/repository/index").json()}
    assert {name: index[name]["reason"] for name in ("diamond", "join", "double", "plus_one")} == {
        name: "unloaded" for name in ("diamond", "join", "double", "plus_one")
    }
    # Loading the ensemble loads its steps first.
    assert httpx.post(f"{base}/v2/repository/models/diamond/load").status_code == 200
    assert httpx.post(f"{base}/v2/models/diamond/infer", json=body).status_code == 200
    # A step unloaded on purpose leaves the server ready (the ensemble is out, not broken).
    assert httpx.post(f"{base}/v2/repository/models/plus_one/unload").status_code == 200
    assert httpx.get(f"{base}/v2/health/ready").status_code == 200


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        (
            '[[step]]\nmodel = "nope"\ninput_map = { X = "IN" }\noutput_map = { Y = "OUT" }',
            "step[0] (nope): Request for unknown model: 'nope' is not found",
        ),
        (
            '[[step]]\nmodel = "plus_one"\ninput_map = { Z = "IN" }\noutput_map = { Y = "OUT" }',
            "step[0] (plus_one): input_map: the model has no input 'Z' (it has: X)",
        ),
        (
            '[[step]]\nmodel = "as_int"\ninput_map = { X = "IN" }\noutput_map = { Y = "OUT" }',
            "input_map.X ('IN'): FP32 is written, INT32 is read",
        ),
        (
            '[[step]]\nmodel = "join"\ninput_map = { A = "IN" }\noutput_map = { SUM = "OUT" }',
            "step[0] (join): input_map: its input 'B' is not mapped",
        ),
        (
            '[[step]]\nmodel = "small"\ninput_map = { X = "IN" }\noutput_map = { Y = "OUT" }',
            "the ensemble takes batches of up to 16, this model of up to 2",
        ),
    ],
)
def test_an_ensemble_that_does_not_fit_its_steps_fails_to_load_naming_them(
    repository, tmp_path, steps, reason
):
    _write_diamond(repository)
    write_model(
        repository,
        "as_int",
        XY_CONFIG.replace("FP32", "INT32"),
        "class Model:\n    def execute(self, inputs):\n        return {'Y': inputs['X']}\n",
    )
    write_model(repository, "small", XY_CONFIG.replace("= 16", "= 2"), XY_PLUS_ONE)
    write_model(repository, "bad", ENSEMBLE_HEAD + steps, None)
    with running_server(repository, tmp_path, *SERVE_BROKEN) as server:
        index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
        assert index["bad"]["state"] == "UNAVAILABLE"
        assert reason in index["bad"]["reason"]
        assert index["diamond"]["state"] == "READY"


def test_a_step_reloaded_into_a_misfit_takes_the_ensemble_out_saying_why(
    diamond_server, repository
):
    base = diamond_server.url
    config = repository / "double" / "config.toml"
    config.write_text(config.read_text().replace("FP32", "FP64"))
    assert httpx.post(f"{base}/v2/repository/models/double/load").status_code == 200
    index = {entry["name"]: entry for entry in httpx.post(f"{base}/v2/repository/index").json()}
    assert index["diamond"]["state"] == "UNAVAILABLE"
    assert "its step model 'double' changed" in index["diamond"]["reason"]
    assert "FP64 is written, FP32 is read" in index["diamond"]["reason"]
