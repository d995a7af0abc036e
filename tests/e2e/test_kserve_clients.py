"""KServe's own clients against reposerve, unchanged: the `kserve` SDK's InferenceRESTClient
(protocol v2, JSON and binary tensors) and InferenceGRPCClient, the way an application in a
KServe cluster calls an InferenceService that runs on the reposerve runtime."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import numpy as np
import pytest
from kserve.inference_client import InferenceGRPCClient, InferenceRESTClient, RESTConfig
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput

from tests.server import Server

pytestmark = pytest.mark.e2e

ROWS = 3


def _add_sub_request(binary: bool, wrong_type: bool = False) -> tuple[InferRequest, np.ndarray]:
    dtype, datatype = (np.float32, "FP32") if wrong_type else (np.int32, "INT32")
    a = np.arange(ROWS * 16, dtype=dtype).reshape(ROWS, 16)
    b = np.full((ROWS, 16), 5, dtype=dtype)
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    outputs = [RequestedOutput("OUTPUT0", {"binary_data": binary}), RequestedOutput("OUTPUT1")]
    return InferRequest("add_sub", inputs, request_id="kserve-1", request_outputs=outputs), a


def _check_add_sub(response, a: np.ndarray) -> None:
    by_name = {output.name: output.as_numpy() for output in response.outputs}
    assert response.model_name == "add_sub" and response.id == "kserve-1"
    np.testing.assert_array_equal(by_name["OUTPUT0"], a + 5)
    np.testing.assert_array_equal(by_name["OUTPUT1"], a - 5)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_the_rest_client_reads_health_and_infers(bundled_server: Server, binary: bool):
    async def calls() -> None:
        base = f"http://{bundled_server.address}"
        async with InferenceRESTClient(RESTConfig(protocol="v2", timeout=30)) as client:
            assert await client.is_server_live(base) is True
            assert await client.is_server_ready(base) is True
            assert await client.is_model_ready(base, "add_sub") is True
            request, a = _add_sub_request(binary)
            _check_add_sub(await client.infer(base, request, model_name="add_sub"), a)

    asyncio.run(calls())


def test_the_rest_client_shows_our_error(bundled_server: Server):
    async def calls() -> httpx.HTTPStatusError:
        base = f"http://{bundled_server.address}"
        async with InferenceRESTClient(RESTConfig(protocol="v2", timeout=30)) as client:
            request, _ = _add_sub_request(binary=False, wrong_type=True)
            with pytest.raises(httpx.HTTPStatusError) as raised:
                await client.infer(base, request, model_name="add_sub")
            return raised.value

    error = asyncio.run(calls())
    assert error.response.status_code == 400
    # the SDK puts the server's "error" text into its message: ours names model and input
    assert "add_sub" in str(error) and "INPUT0" in str(error) and "FP32" in str(error)


def test_the_grpc_client_reads_health_and_infers(bundled_server: Server):
    async def calls() -> None:
        async with InferenceGRPCClient(bundled_server.grpc_address, timeout=30) as client:
            assert await client.is_server_live() is True
            assert await client.is_server_ready() is True
            assert await client.is_model_ready("add_sub") is True
            request, a = _add_sub_request(binary=True)
            _check_add_sub(await client.infer(request), a)
            wrong, _ = _add_sub_request(binary=True, wrong_type=True)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await client.infer(wrong)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "INPUT0" in raised.value.details()

    asyncio.run(calls())
