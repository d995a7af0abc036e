"""The HTTP front at its edges: absurdly nested JSON and tensors with no elements.
Real servers; tritonclient and httpx."""

from __future__ import annotations

import httpx
import msgspec
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.server import start_server
from tests.toy_models import PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e

ECHO = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"]}
"""

GOOD = {"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    write_model(root, "plus_one", vector_config(), PLUS_ONE)
    write_model(root, "echo_var", vector_config(size=-1), ECHO)
    write_model(root, "echo_var_unbatched", vector_config(size=-1, max_batch=0), ECHO)
    write_model(root, "echo_bytes", vector_config("BYTES", size=-1), ECHO)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
def client(server):
    client = httpclient.InferenceServerClient(server.address, network_timeout=30)
    yield client
    client.close()


def _assert_serving(url: str) -> None:
    response = httpx.post(f"{url}/v2/models/plus_one/infer", json=GOOD, timeout=10)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2.0] * 16


def _plus_one_inputs(values: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values, binary_data=binary)
    return [tensor]


# -- nesting -----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["data", "parameters", "input parameters"])
def test_deeply_nested_json_is_400(server, http, where):
    deep = b"[" * 100_000 + b"1" + b"]" * 100_000
    if where == "data":
        document = b'{"inputs":[{"name":"INPUT","shape":[1,16],"datatype":"FP32","data":%s}]}'
    elif where == "parameters":
        document = msgspec.json.encode(GOOD)[:-1] + b',"parameters":{"x":%s}}'
    else:
        document = b'{"inputs":[{"name":"INPUT","shape":[1,16],"datatype":"FP32",'
        document += b'"parameters":{"x":%s},"data":[1,2]}]}'
    response = http.post("/v2/models/plus_one/infer", content=document % deep)
    assert response.status_code == 400, response.text
    assert response.json() == {
        "error": "model 'plus_one': request JSON nests arrays or objects too deeply to parse; "
        "send tensor data flat, or nested no deeper than its shape"
    }
    _assert_serving(server.url)


def test_data_nested_deeper_than_its_shape_is_400(server, http):
    # Parseable JSON, but 100 levels deep: more than numpy's 64 dimensions.
    nested: object = 1.0
    for _ in range(100):
        nested = [nested]
    document = {"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "FP32", "data": nested}]}
    response = http.post("/v2/models/plus_one/infer", json=document)
    assert response.status_code == 400
    assert response.json() == {
        "error": "model 'plus_one': input 'INPUT': data nests 100 arrays deep, shape [1, 16] "
        "has 2 dimensions; send it flat or nested as the shape"
    }
    _assert_serving(server.url)


# -- tensors with no elements ------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False])
def test_zero_length_variable_dim_through_tritonclient(client, binary):
    for model, shape in (("echo_var", [1, 0]), ("echo_var", [3, 0]), ("echo_var_unbatched", [0])):
        values = np.zeros(shape, dtype=np.float32)
        result = client.infer(
            model,
            _plus_one_inputs(values, binary),
            outputs=[httpclient.InferRequestedOutput("OUTPUT", binary_data=binary)],
        )
        assert result.get_output("OUTPUT")["shape"] == shape
        assert result.as_numpy("OUTPUT").shape == tuple(shape)


def test_zero_length_variable_dim_through_json_and_binary(http):
    response = http.post(
        "/v2/models/echo_var/infer",
        json={"inputs": [{"name": "INPUT", "shape": [2, 0], "datatype": "FP32", "data": []}]},
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == [
        {"name": "OUTPUT", "datatype": "FP32", "shape": [2, 0], "data": []}
    ]
    header = msgspec.json.encode(
        {
            "inputs": [
                {
                    "name": "INPUT",
                    "shape": [1, 0],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 0},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    response = http.post(
        "/v2/models/echo_bytes/infer",
        content=header,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    json_length = int(response.headers["inference-header-content-length"])
    output = msgspec.json.decode(response.content[:json_length])["outputs"][0]
    assert output["shape"] == [1, 0]
    assert output["parameters"] == {"binary_data_size": 0}
    assert response.content[json_length:] == b""


def test_batch_of_zero_items_is_400(server, http, client):
    response = http.post(
        "/v2/models/echo_var/infer",
        json={"inputs": [{"name": "INPUT", "shape": [0, 4], "datatype": "FP32", "data": []}]},
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": "model 'echo_var': input 'INPUT': shape [0, 4] needs a batch dimension "
        "of 1..8 first"
    }
    with pytest.raises(httpclient.InferenceServerException, match="batch dimension of 1..8"):
        client.infer("echo_var", _plus_one_inputs(np.zeros((0, 4), np.float32), True))
    _assert_serving(server.url)
