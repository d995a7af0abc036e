"""What a model returns is checked after every execute: each way of getting it wrong
fails that batch with a message naming the model and the output, and nothing else."""

from __future__ import annotations

import httpx
import pytest

from tests.server import start_server
from tests.toy_models import vector_config, write_model

pytestmark = pytest.mark.e2e

# The first input value picks the mistake.
MISBEHAVES = """
    import numpy as np

    class Model:
        def execute(self, inputs):
            x = inputs["INPUT"]
            mistake = int(x[0, 0])
            if mistake == 1:
                return {"OTHER": x}
            if mistake == 2:
                return {"OUTPUT": x[:, :1]}
            if mistake == 3:
                return {"OUTPUT": np.concatenate([x, x])}
            if mistake == 4:
                return {"OUTPUT": x.astype(np.float64) + 0.5}
            if mistake == 5:
                return [x]
            if mistake == 6:
                return {"OUTPUT": (x * 2).astype(np.int64)}  # castable: delivered as INT32
            if mistake == 7:
                return {"OUTPUT": x.astype(np.int64) + 2**40}  # same kind, does not fit
            if mistake == 8:
                return {"OUTPUT": x, "EXTRA": x}
            if mistake == 9:
                return {"OUTPUT": x > 0}  # bool -> INT32: same kind, always fits
            return {"OUTPUT": x}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    write_model(root, "misbehaves", vector_config(datatype="INT32", size=2), MISBEHAVES)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


def _call(server, first: int) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "INT32", "data": [first, 7]}]}
    return httpx.post(f"{server.url}/v2/models/misbehaves/infer", json=body)


@pytest.mark.parametrize(
    ("mistake", "message"),
    [
        (
            1,
            "execute() returned undeclared output(s) OTHER. "
            "Hint: declare them as [[output]] in config.toml, or stop returning them",
        ),
        (2, "output 'OUTPUT': expected item shape [2], got [1]"),
        (3, "output 'OUTPUT': expected 1 items on axis 0, got shape [2, 2]"),
        (
            4,
            "output 'OUTPUT': expected INT32, got float64, which does not convert without "
            "changing its meaning. Hint: return the declared type, or declare this one",
        ),
        (5, "execute() must return a dict of arrays, got list"),
        (7, "output 'OUTPUT': value 1099511627783 returned as int64 does not fit INT32"),
        (
            8,
            "execute() returned undeclared output(s) EXTRA. "
            "Hint: declare them as [[output]] in config.toml, or stop returning them",
        ),
    ],
)
def test_bad_outputs_fail_the_batch_clearly(server, mistake, message):
    response = _call(server, mistake)
    assert response.status_code == 500
    assert response.json() == {"error": f"model 'misbehaves' version 1: {message}"}
    assert _call(server, 0).json()["outputs"][0]["data"] == [0, 7]


@pytest.mark.parametrize(("mistake", "data"), [(6, [12, 14]), (9, [1, 1])])
def test_same_kind_outputs_that_fit_are_delivered_as_declared(server, mistake, data):
    output = _call(server, mistake).json()["outputs"][0]
    assert output["datatype"] == "INT32" and output["data"] == data
