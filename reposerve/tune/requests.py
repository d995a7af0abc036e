"""Requests to load a model with: random data of the right datatypes and shapes made from
its metadata, or real samples (``reposerve tune --inputs``): a folder of files, each one
item of the model's one BYTES input (JPEGs for an image model), or a file of V2 requests.

Each request is kept as a body and its headers, so the load generator sends the same bytes
the output checks send one at a time.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from reposerve.datatypes import NUMPY_DTYPES, element_count, pack_bytes
from reposerve.errors import TuneError
from reposerve.tune.load import encode_request

HEADER_LENGTH = "Inference-Header-Content-Length"
Tensor = tuple[str, str, list[int], bytes]  # name, datatype, shape, raw bytes


class SampleRequest(msgspec.Struct, frozen=True):
    body: bytes
    headers: dict[str, str] = {}
    batch: int = 1  # the items it carries, on the batch dimension

    def payload(self, host: str, model: str) -> bytes:
        """The whole HTTP request, as the load generator writes it."""
        return encode_request(host, f"/v2/models/{model}/infer", self.body, self.headers)


class _V2Input(msgspec.Struct):
    name: str
    shape: list[int]
    datatype: str


class _V2Request(msgspec.Struct):
    inputs: list[_V2Input]


def binary_request(tensors: list[Tensor], outputs: list[str] | None = None) -> SampleRequest:
    """A V2 request carrying ``tensors`` as binary tensor data, asking for ``outputs`` (or,
    when None, every output) as binary data."""
    header: dict = {
        "inputs": [
            {
                "name": name,
                "shape": shape,
                "datatype": datatype,
                "parameters": {"binary_data_size": len(raw)},
            }
            for name, datatype, shape, raw in tensors
        ]
    }
    if outputs is None:
        header["parameters"] = {"binary_data_output": True}
    else:
        header["outputs"] = [
            {"name": name, "parameters": {"binary_data": True}} for name in outputs
        ]
    encoded = msgspec.json.encode(header)
    body = encoded + b"".join(raw for _, _, _, raw in tensors)
    batch = tensors[0][2][0] if tensors and tensors[0][2] else 1
    return SampleRequest(body, {HEADER_LENGTH: str(len(encoded))}, batch)


def generated_requests(
    metadata: dict,
    batched: bool,
    batch: int = 1,
    binary: bool = True,
    shapes: dict[str, list[int]] | None = None,
    count: int = 16,
) -> list[SampleRequest]:
    """``count`` distinct requests of random data for the model ``metadata`` describes.

    Dimensions that are -1 become 1 unless ``shapes`` gives the item shape of that input.
    """
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
            requests.append(binary_request(wire))
        else:
            body = msgspec.json.encode(
                {
                    "inputs": [
                        {"name": name, "datatype": datatype, "shape": shape, "data": _json(values)}
                        for name, datatype, shape, values in tensors
                    ]
                }
            )
            requests.append(SampleRequest(body, {}, batch if batched else 1))
    return requests


def sample_requests(path: Path, metadata: dict, batched: bool) -> list[SampleRequest]:
    """The requests ``--inputs PATH`` names: each file of a folder as one item of the
    model's BYTES input, or the V2 requests of a JSON file (one object, a list of them,
    or one per line)."""
    if path.is_dir():
        return _file_items(path, metadata, batched)
    if not path.is_file():
        raise TuneError(f"--inputs {path}: no such file or folder")
    text = path.read_bytes()
    try:
        document = msgspec.json.decode(text)
        documents = document if isinstance(document, list) else [document]
    except msgspec.DecodeError:
        try:
            documents = [msgspec.json.decode(line) for line in text.splitlines() if line.strip()]
        except msgspec.DecodeError as exc:
            raise TuneError(
                f"--inputs {path}: expected V2 requests as JSON (one object, a list, or one "
                f"per line): {exc}"
            ) from None
    requests = []
    for index, document in enumerate(documents):
        try:
            request = msgspec.convert(document, _V2Request)
        except msgspec.ValidationError as exc:
            raise TuneError(f"--inputs {path}: request {index}: not a V2 request: {exc}") from None
        shape = request.inputs[0].shape if request.inputs else []
        batch = shape[0] if batched and shape else 1
        requests.append(SampleRequest(msgspec.json.encode(document), {}, batch))
    if not requests:
        raise TuneError(f"--inputs {path}: holds no request")
    return requests


def _file_items(folder: Path, metadata: dict, batched: bool) -> list[SampleRequest]:
    inputs = metadata["inputs"]
    if len(inputs) != 1 or inputs[0]["datatype"] != "BYTES":
        raise TuneError(
            f"--inputs {folder}: a folder of files feeds a model with one BYTES input; "
            f"{metadata['name']} takes {', '.join(i['name'] + ' ' + i['datatype'] for i in inputs)}"
            ": give a file of V2 requests instead"
        )
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise TuneError(f"--inputs {folder}: the folder holds no file")
    name = inputs[0]["name"]
    rest = [max(dim, 1) for dim in inputs[0]["shape"][1 if batched else 0 :]]
    if element_count(rest) != 1:
        raise TuneError(
            f"--inputs {folder}: input {name} takes {element_count(rest)} items per request; "
            "a folder gives one file per request"
        )
    shape = [1, *rest] if batched else rest
    return [binary_request([(name, "BYTES", shape, pack_bytes([p.read_bytes()]))]) for p in files]


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


def _raw(datatype: str, values: np.ndarray) -> bytes:
    return pack_bytes(values.tolist()) if datatype == "BYTES" else values.tobytes()


def _json(values: np.ndarray) -> list:
    if values.dtype == object:
        return [item.decode() for item in values.tolist()]
    return values.tolist()
