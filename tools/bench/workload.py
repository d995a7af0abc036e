"""Requests for any served model, made from its metadata: random data of the right
datatypes and shapes, as JSON or binary tensors (what ``python -m tools.bench load`` sends)."""

from __future__ import annotations

import json
import urllib.request

import msgspec
import numpy as np

from reposerve.datatypes import NUMPY_DTYPES, element_count, pack_bytes
from tools.bench.loadgen import encode_binary_infer, encode_request


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def _values(datatype: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    count = element_count(shape)
    if datatype == "BYTES":
        return np.array([rng.bytes(8).hex().encode() for _ in range(count)], dtype=object)
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(bool)
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind == "f" and datatype != "BF16":
        return rng.standard_normal(count).astype(dtype)
    return rng.integers(0, 100, count).astype(dtype)


def payloads(
    address: str,
    model: str,
    batch: int = 1,
    binary: bool = False,
    shapes: dict[str, list[int]] | None = None,
    count: int = 16,
) -> list[bytes]:
    """``count`` distinct requests for ``model`` on the server at ``address`` (host:port).

    Dimensions that are -1 become 1 unless ``shapes`` gives the item shape of that input.
    """
    base = f"http://{address}/v2/models/{model}"
    metadata = _get(base)
    batched = _get(f"{base}/config")["max_batch_size"] > 0
    host = address.rsplit(":", 1)[0]
    rng = np.random.default_rng(0)
    requests = []
    for _ in range(count):
        tensors = []
        for spec in metadata["inputs"]:
            item = (shapes or {}).get(spec["name"]) or [
                max(dim, 1) for dim in spec["shape"][1 if batched else 0 :]
            ]
            shape = [batch, *item] if batched else item
            tensors.append(
                (spec["name"], spec["datatype"], shape, _values(spec["datatype"], shape, rng))
            )
        if binary:
            wire = [
                (name, datatype, shape, _raw(datatype, values))
                for name, datatype, shape, values in tensors
            ]
            requests.append(encode_binary_infer(host, model, wire))
        else:
            body = msgspec.json.encode(
                {
                    "inputs": [
                        {"name": name, "datatype": datatype, "shape": shape, "data": _json(values)}
                        for name, datatype, shape, values in tensors
                    ]
                }
            )
            requests.append(encode_request(host, f"/v2/models/{model}/infer", body))
    return requests


def _raw(datatype: str, values: np.ndarray) -> bytes:
    return pack_bytes(values.tolist()) if datatype == "BYTES" else values.tobytes()


def _json(values: np.ndarray) -> list:
    if values.dtype == object:
        return [item.decode() for item in values.tolist()]
    return values.tolist()
