"""What the tests ask of KServe's `kserve` SDK, run as `python -m tests.kserve_sdk ...` in a
process of its own: the SDK registers Open Inference Protocol messages (`inference.*`) in
protobuf's default pool, and so does tritonclient.grpc, which the test process imports; one
process cannot hold both. Results go to stdout as JSON.

  walk MODEL      build the JSON document on stdin into the SDK model MODEL; the problems
  clients H G     KServe's REST client (protocol v2) on H=host:port and gRPC client on G,
                  against add_sub: health, JSON and binary inference, an error
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any


def walk(document: dict[str, Any], model: str) -> list[str]:
    problems: list[str] = []
    _build(document, model, document.get("kind", "?"), problems)
    return problems


_SCALARS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "datetime": (str,),
    "date": (str,),
    # The SDK names this type but generates no model of it: KServe's Go type is a
    # resource.Quantity, which Kubernetes reads from a string or a number.
    "V1beta1MetricQuantity": (str, int, float),
}


def _model_class(name: str) -> type | None:
    import kserve.models
    from kubernetes.client import models as kubernetes_models

    return getattr(kserve.models, name, None) or getattr(kubernetes_models, name, None)


def _build(value: Any, type_name: str, where: str, problems: list[str]) -> Any:
    if type_name == "object":
        return value
    # kserve's models spell containers list[X] and dict(str, X); kubernetes' List[X], Dict[str, X]
    if match := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            problems.append(f"{where}: a list expected, found {value!r}")
            return None
        return [_build(item, match[1], f"{where}[{i}]", problems) for i, item in enumerate(value)]
    if match := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        if not isinstance(value, dict):
            problems.append(f"{where}: a mapping expected, found {value!r}")
            return None
        item_type = match[1] or match[2]
        return {k: _build(v, item_type, f"{where}.{k}", problems) for k, v in value.items()}
    if type_name in _SCALARS:
        wanted = _SCALARS[type_name]
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            problems.append(f"{where}: {type_name} expected, found {value!r}")
        return value
    model = _model_class(type_name)
    if model is None:
        problems.append(f"{where}: the SDK has no model {type_name}")
        return None
    if not isinstance(value, dict):
        problems.append(f"{where}: a {type_name} mapping expected, found {value!r}")
        return None
    attribute_of = {key: attribute for attribute, key in model.attribute_map.items()}
    fields: dict[str, Any] = {}
    for key, item in value.items():
        attribute = attribute_of.get(key)
        if attribute is None:
            problems.append(f"{where}.{key}: not a field of {type_name}")
            continue
        fields[attribute] = _build(item, model.openapi_types[attribute], f"{where}.{key}", problems)
    try:
        return model(**fields)  # the SDK's own checks: required fields, enumerations
    except ValueError as error:
        problems.append(f"{where}: {error}")
        return None


ROWS = 3


def _add_sub_request(binary: bool, wrong_type: bool = False):
    import numpy as np
    from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput

    dtype, datatype = (np.float32, "FP32") if wrong_type else (np.int32, "INT32")
    a = np.arange(ROWS * 16, dtype=dtype).reshape(ROWS, 16)
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", np.full_like(a, 5))):
        tensor = InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    outputs = [RequestedOutput("OUTPUT0", {"binary_data": binary}), RequestedOutput("OUTPUT1")]
    return InferRequest("add_sub", inputs, request_id="kserve-1", request_outputs=outputs)


def _answer(response) -> dict[str, Any]:
    return {
        "model_name": response.model_name,
        "id": response.id,
        "outputs": {output.name: output.as_numpy().tolist() for output in response.outputs},
    }


async def _rest(address: str) -> dict[str, Any]:
    import httpx
    from kserve.inference_client import InferenceRESTClient, RESTConfig

    base = f"http://{address}"
    async with InferenceRESTClient(RESTConfig(protocol="v2", timeout=30)) as client:
        seen: dict[str, Any] = {
            "live": await client.is_server_live(base),
            "ready": await client.is_server_ready(base),
            "model_ready": await client.is_model_ready(base, "add_sub"),
        }
        for binary in (False, True):
            response = await client.infer(base, _add_sub_request(binary), model_name="add_sub")
            seen["binary" if binary else "json"] = _answer(response)
        try:
            await client.infer(base, _add_sub_request(False, wrong_type=True), model_name="add_sub")
        except httpx.HTTPStatusError as error:
            seen["error"] = {"status": error.response.status_code, "message": str(error)}
    return seen


async def _grpc(address: str) -> dict[str, Any]:
    import grpc
    from kserve.inference_client import InferenceGRPCClient

    async with InferenceGRPCClient(address, timeout=30) as client:
        seen: dict[str, Any] = {
            "live": await client.is_server_live(),
            "ready": await client.is_server_ready(),
            "model_ready": await client.is_model_ready("add_sub"),
            "binary": _answer(await client.infer(_add_sub_request(True))),
        }
        try:
            await client.infer(_add_sub_request(True, wrong_type=True))
        except grpc.aio.AioRpcError as error:
            seen["error"] = {"status": error.code().name, "message": error.details()}
    return seen


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "walk":
        print(json.dumps(walk(json.load(sys.stdin), args[0])))
    elif command == "clients":
        http_address, grpc_address = args
        seen = {"rest": asyncio.run(_rest(http_address)), "grpc": asyncio.run(_grpc(grpc_address))}
        print(json.dumps(seen))
    else:
        raise SystemExit(f"unknown command {command!r}: walk or clients")


if __name__ == "__main__":
    main(sys.argv[1:])
