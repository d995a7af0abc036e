"""Ensembles that would never answer, or answer what they do not declare, are stopped:
a load (here through a config override) that makes an ensemble reach itself, directly or
through another ensemble, is refused naming the cycle while what served keeps serving;
an ensemble whose steps produce a shape its config does not declare fails that request
naming the ensemble, the output and both shapes."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server import SERVE_BROKEN, running_server, start_server
from tests.toy_models import write_model

pytestmark = pytest.mark.e2e

# Lower-case tensor names throughout: the override's maps keep them as written.
PLAIN = """
    max_batch_size = 8
    [[input]]
    name = "x"
    datatype = "FP32"
    shape = [-1]
    [[output]]
    name = "y"
    datatype = "FP32"
    shape = [-1]
"""
PLUS_ONE = """
    class Model:
        def execute(self, inputs):
            return {"y": inputs["x"] + 1}
"""
# Drops the last element: a shape the ensemble below does not declare for 4 in.
SHORTER = """
    class Model:
        def execute(self, inputs):
            return {"y": inputs["x"][:, :-1] + 1}
"""


def _ensemble(step: str, size: int = -1) -> str:
    return f"""
        backend = "ensemble"
        max_batch_size = 8
        [[input]]
        name = "x"
        datatype = "FP32"
        shape = [{size}]
        [[output]]
        name = "y"
        datatype = "FP32"
        shape = [{size}]
        [[step]]
        model = "{step}"
        input_map = {{ x = "x" }}
        output_map = {{ y = "y" }}
    """


BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def _answers(base: str, model: str, sent: int) -> list[int]:
    """The status of each of ``sent`` requests answered; a request never answered (the
    client gives up on it) is missing."""
    answered = []
    with httpx.Client(timeout=10) as client:
        for _ in range(sent):
            try:
                answered.append(client.post(f"{base}/v2/models/{model}/infer", json=BODY))
            except httpx.TimeoutException:
                continue
    return [reply.status_code for reply in answered]


def _override(base: str, model: str, step: str) -> httpx.Response:
    """Load ``model`` with its own served config, its one step now calling ``step``."""
    config = httpx.get(f"{base}/v2/models/{model}/config").json()
    config["ensemble_scheduling"]["step"][0]["model_name"] = step
    body = {"parameters": {"config": json.dumps(config)}}
    return httpx.post(f"{base}/v2/repository/models/{model}/load", json=body, timeout=60)


@pytest.fixture
def pipeline_server(repository, tmp_path):
    write_model(repository, "plus_one", PLAIN, PLUS_ONE)
    write_model(repository, "inner", _ensemble("plus_one"), None)
    write_model(repository, "outer", _ensemble("inner"), None)
    server = start_server(repository, tmp_path, *SERVE_BROKEN)
    yield server
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize(
    ("model", "step", "cycle"),
    [
        ("inner", "inner", "inner -> inner"),
        ("inner", "outer", "inner -> outer -> inner"),
    ],
)
def test_a_load_that_makes_an_ensemble_reach_itself_is_refused_naming_the_cycle(
    pipeline_server, model, step, cycle
):
    base = pipeline_server.url
    refused = _override(base, model, step)
    # What served before serves on: every request sent is answered.
    assert _answers(base, "inner", 3) == [200] * 3
    assert _answers(base, "outer", 3) == [200] * 3
    assert refused.status_code == 400, refused.text
    assert (
        f"failed to load '{model}': version 1: model '{model}' version 1: circular dependency "
        f"between ensembles: {cycle}. Hint: an ensemble cannot be a step of itself, directly "
        "or through another ensemble (the previous one keeps serving)"
    ) == refused.json()["error"]
    index = {e["name"]: e for e in httpx.post(f"{base}/v2/repository/index").json()}
    assert {name: index[name]["state"] for name in ("inner", "outer")} == {
        "inner": "READY",
        "outer": "READY",
    }


def test_an_ensemble_loaded_onto_a_cycle_is_refused(pipeline_server, repository):
    """The cycle closed by the ensemble loaded second: ``outer`` was made to call a plain
    model, then ``inner`` (still calling ``outer``'s old step) is loaded calling ``outer``,
    whose own step is then pointed back at ``inner``."""
    base = pipeline_server.url
    assert _override(base, "outer", "plus_one").status_code == 200
    assert _override(base, "inner", "outer").status_code == 200  # inner -> outer -> plus_one
    refused = _override(base, "outer", "inner")
    assert _answers(base, "inner", 3) == [200] * 3
    assert refused.status_code == 400
    assert "circular dependency between ensembles: outer -> inner -> outer" in refused.text


def test_an_output_shape_the_ensemble_does_not_declare_fails_the_request(repository, tmp_path):
    """The step declares any length, the ensemble 4: the load cannot tell; the answer can."""
    write_model(repository, "plus_one", PLAIN, PLUS_ONE)
    write_model(repository, "shorter", PLAIN, SHORTER)
    write_model(repository, "fits", _ensemble("plus_one", 4), None)
    write_model(repository, "misfit", _ensemble("shorter", 4), None)
    with running_server(repository, tmp_path) as server:
        sent = 4
        with httpx.Client(base_url=server.url, timeout=30) as client:
            replies = [client.post("/v2/models/misfit/infer", json=BODY) for _ in range(sent)]
            fitting = client.post("/v2/models/fits/infer", json=BODY)
        assert [reply.status_code for reply in replies] == [500] * sent
        assert {reply.json()["error"] for reply in replies} == {
            "model 'misfit' version 1: output 'y': its steps produced shape [1, 3], the "
            "ensemble declares [-1, 4]"
        }
        assert fitting.status_code == 200
        assert fitting.json()["outputs"][0]["data"] == [2, 3, 4, 5]
        stats = httpx.get(f"{server.url}/v2/models/misfit/stats").json()["model_stats"][0]
        assert stats["inference_stats"]["fail"]["count"] == sent
