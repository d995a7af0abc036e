"""Hostile and unlucky load overrides (Triton's ``parameters.config``), against a real
server: a malformed config of any shape is a 400 naming the field, never a 500 with a
traceback, and the models that serve keep serving; an ensemble's own ``/config``, posted
back as its override, loads (its tensor-name maps keep their case); a name of thousands of
characters is a 400."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server import start_server
from tests.toy_models import ensemble_head, vector_config, write_model

pytestmark = pytest.mark.e2e

CAMEL = """
    class Model:
        def execute(self, inputs):
            return {"OutPut": inputs["InPut"] + 1}
"""

BASE = {
    "name": "camel",
    "backend": "python",
    "max_batch_size": 8,
    "input": [{"name": "InPut", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OutPut", "data_type": "TYPE_FP32", "dims": [4]}],
}


def _input(**fields: object) -> dict:
    return {"input": [{"name": "InPut", "data_type": "TYPE_FP32", "dims": [4]} | fields]}


# (what is wrong, the override's fields, a word the error must hold)
MALFORMED = [
    ("input not a list", {"input": {"name": "InPut"}}, "input"),
    ("dims of strings", _input(dims=["x"]), "dims"),
    ("nested dims", _input(dims=[[4]]), "dims"),
    ("dims out of range", _input(dims=[2**70]), "dims"),
    ("instance_group an object", {"instance_group": {"count": 1}}, "instance_group"),
    ("count a word", {"instance_group": [{"count": "two"}]}, "count"),
    ("dynamic_batching a number", {"dynamic_batching": 5}, "dynamic_batching"),
    ("delay a list", {"dynamic_batching": {"max_queue_delay_microseconds": [1]}}, "delay"),
    ("sizes a word", {"dynamic_batching": {"preferred_batch_size": "x"}}, "batch_size"),
    ("version_policy a word", {"version_policy": "latest"}, "version_policy"),
    ("latest a list", {"version_policy": {"latest": [1]}}, "version_policy"),
    ("max_batch_size a fraction", {"max_batch_size": 1.5}, "max_batch_size"),
    ("steps a word", {"ensemble_scheduling": {"step": "x"}}, "step"),
    ("reshape a word", _input(reshape={"shape": "x"}), "reshape"),
    ("warmup a word", {"model_warmup": "x"}, "model_warmup"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    config = vector_config(size=4).replace('"INPUT"', '"InPut"').replace('"OUTPUT"', '"OutPut"')
    write_model(root, "camel", config, CAMEL)
    step = (
        '[[step]]\nmodel = "camel"\ninput_map = { InPut = "IN" }\noutput_map = { OutPut = "OUT" }'
    )
    write_model(root, "chain", ensemble_head(8) + step, None)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


def _load(server, name: str, config: object) -> httpx.Response:
    body = {"parameters": {"config": config if isinstance(config, str) else json.dumps(config)}}
    return httpx.post(f"{server.url}/v2/repository/models/{name}/load", json=body, timeout=60)


def _serves(server) -> bool:
    body = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
    reply = httpx.post(f"{server.url}/v2/models/chain/infer", json=body, timeout=30)
    return reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [2.0] * 4


def test_malformed_overrides_are_400s_naming_the_field(server):
    answered = []
    for what, fields, field in MALFORMED:
        reply = _load(server, "camel", BASE | fields)
        answered.append(reply.status_code)
        assert reply.status_code == 400, (what, reply.text)
        error = reply.json()["error"]
        assert field in error and "Traceback" not in error, (what, error)
    assert len(answered) == len(MALFORMED)
    assert _serves(server)  # what served before still serves


def test_deeply_nested_overrides_are_400s(server):
    deep_field = (
        json.dumps(BASE)[:-1] + ', "dynamic_batching": ' + '{"a":' * 5000 + "1" + "}" * 5000 + "}"
    )
    deep_parameter = BASE | {"parameters": {"p": {"string_value": "[" * 5000 + "]" * 5000}}}
    reply = _load(server, "camel", deep_field)
    assert reply.status_code == 400 and "nested too deeply" in reply.json()["error"], reply.text
    # A parameter is free text to reposerve: too deep to be a setting, it stays text.
    assert _load(server, "camel", deep_parameter).status_code == 200
    assert _serves(server)


def test_an_ensembles_own_config_loads_back_as_its_override(server):
    config = httpx.get(f"{server.url}/v2/models/chain/config", timeout=10).json()
    (step,) = config["ensemble_scheduling"]["step"]
    assert step["input_map"] == {"InPut": "IN"} and step["output_map"] == {"OutPut": "OUT"}
    reply = _load(server, "chain", config)
    assert reply.status_code == 200, reply.text
    assert _serves(server)


@pytest.mark.parametrize("length", [300, 5000])
def test_a_name_of_thousands_of_characters_is_a_400(server, length):
    name = "m" * length
    load = httpx.post(f"{server.url}/v2/repository/models/{name}/load", timeout=30)
    assert load.status_code in (400, 404), load.text
    assert "Traceback" not in load.text
    infer = httpx.post(f"{server.url}/v2/models/{name}/infer", json={"inputs": []}, timeout=30)
    assert infer.status_code in (400, 404), infer.text
    override = _load(server, "camel", BASE | {"name": name})
    assert override.status_code == 400, override.text
    assert _serves(server)
