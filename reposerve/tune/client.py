"""The calls ``reposerve tune`` makes besides its load: metadata, config, loads with a
config override, unloads, and one inference at a time (to compare outputs), over the V2
HTTP protocol, so the server may be one tune started or one already running elsewhere."""

from __future__ import annotations

import urllib.error
import urllib.request

import msgspec
import numpy as np

from reposerve.datatypes import NUMPY_DTYPES, to_numpy
from reposerve.errors import TuneError
from reposerve.tune.requests import HEADER_LENGTH, SampleRequest, generated_requests

# A load runs the model's own start-up (an ONNX session, a torch.compile): minutes at worst.
LOAD_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 60.0


class _Output(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    data: list | None = None
    parameters: dict[str, object] = {}


class _Response(msgspec.Struct):
    outputs: list[_Output] = []


class ServerClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self.host, _, port = address.rpartition(":")
        self.port = int(port)

    def get(self, path: str) -> dict:
        return msgspec.json.decode(self._call("GET", path, None, {}, CALL_TIMEOUT_S)[1])

    def index(self) -> list[dict]:
        """The repository index: every model's name, version, state and reason."""
        reply = self._call("POST", "/v2/repository/index", b"{}", {}, CALL_TIMEOUT_S)[1]
        return msgspec.json.decode(reply)

    def ready(self, model: str) -> bool:
        try:
            self._call("GET", f"/v2/models/{model}/ready", None, {}, CALL_TIMEOUT_S)
        except TuneError:
            return False
        return True

    def config(self, model: str) -> dict:
        return self.get(f"/v2/models/{model}/config")

    def metadata(self, model: str) -> dict:
        return self.get(f"/v2/models/{model}")

    def load(self, model: str, config: dict | None = None) -> None:
        """Load ``model``: with ``config`` (Triton's model-config JSON) instead of its
        folder's, or from its folder when None. TuneError with the server's reason."""
        parameters = {}
        if config is not None:
            parameters["config"] = msgspec.json.encode(config).decode()
        body = msgspec.json.encode({"parameters": parameters})
        self._call("POST", f"/v2/repository/models/{model}/load", body, {}, LOAD_TIMEOUT_S)

    def unload(self, model: str) -> None:
        """Unload ``model`` and what loading it loaded (an ensemble's steps)."""
        body = msgspec.json.encode({"parameters": {"unload_dependents": True}})
        self._call("POST", f"/v2/repository/models/{model}/unload", body, {}, LOAD_TIMEOUT_S)

    def infer(self, model: str, request: SampleRequest) -> dict[str, np.ndarray]:
        """One request's outputs by name (JSON or binary answers alike)."""
        headers, body = self._call(
            "POST", f"/v2/models/{model}/infer", request.body, request.headers, CALL_TIMEOUT_S
        )
        return decode_outputs(body, headers.get(HEADER_LENGTH.lower()))

    def _call(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> tuple[dict[str, str], bytes]:
        """The answer's headers (names in lower case) and body."""
        url = f"http://{self.address}{path}"
        call = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(call, timeout=timeout) as reply:
                return {k.lower(): v for k, v in reply.headers.items()}, reply.read()
        except urllib.error.HTTPError as exc:
            raise TuneError(f"{method} {path}: {exc.code} {_reason(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise TuneError(f"{method} {url}: no answer ({exc})") from None


def decode_outputs(body: bytes, header_length: str | None) -> dict[str, np.ndarray]:
    """A V2 response's outputs: from its JSON, or its binary tensor data after the JSON
    header when ``header_length`` (Inference-Header-Content-Length) is given."""
    split = int(header_length) if header_length else len(body)
    response = msgspec.json.decode(body[:split], type=_Response)
    blob = memoryview(body)[split:]
    outputs: dict[str, np.ndarray] = {}
    for output in response.outputs:
        size = output.parameters.get("binary_data_size")
        if isinstance(size, int):
            raw, blob = bytes(blob[:size]), blob[size:]
            outputs[output.name] = to_numpy(output.datatype, tuple(output.shape), raw)
        else:
            values = [v.encode() if isinstance(v, str) else v for v in output.data or []]
            array = np.array(values, dtype=_json_dtype(output.datatype))
            outputs[output.name] = array.reshape(output.shape)
    return outputs


def _json_dtype(datatype: str) -> np.dtype | type[object]:
    return object if datatype == "BYTES" else NUMPY_DTYPES[datatype]


def _reason(body: bytes) -> str:
    try:
        return str(msgspec.json.decode(body)["error"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return body.decode(errors="replace")[:500]


def requests_for(
    client: ServerClient,
    model: str,
    batch: int = 1,
    binary: bool = True,
    shapes: dict[str, list[int]] | None = None,
    count: int = 16,
) -> list[SampleRequest]:
    """Random requests for ``model`` as the server describes it (see generated_requests)."""
    batched = client.config(model).get("max_batch_size", 0) > 0
    return generated_requests(client.metadata(model), batched, batch, binary, shapes, count)
