"""The load request of Triton's model repository extension, decoded.

``POST /v2/repository/models/{m}/load`` may carry ``parameters``:

- ``config``: the model's configuration as Triton's model-config JSON (a string), used for
  this load instead of the model folder's;
- ``file:<path>``: one file of the model folder to load from instead of the repository's,
  base64 (``file:1/model.py``, or ``file:/1/model.py``); Triton requires ``config`` with
  them, since the folder they form holds no configuration of its own.

Any other parameter is an error naming it: a load must not quietly differ from the one asked.
"""

from __future__ import annotations

import binascii
from base64 import b64decode
from pathlib import PurePosixPath

import msgspec

from reposerve.errors import ProtocolError

FILE_PREFIX = "file:"


class LoadRequest(msgspec.Struct, frozen=True):
    config: str | None = None  # Triton's model-config JSON
    files: dict[str, bytes] = {}  # path inside the model folder -> content


class _Body(msgspec.Struct):
    parameters: dict[str, object] | None = None


def decode_load_request(name: str, body: bytes) -> LoadRequest:
    try:
        parameters = msgspec.json.decode(body or b"{}", type=_Body).parameters or {}
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ProtocolError(f"load '{name}': malformed request JSON: {exc}") from exc
    config = None
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        where = f"load '{name}': parameters.{key}"
        if key == "config":
            if not isinstance(value, str):
                raise ProtocolError(f"{where}: expected the model config as a JSON string")
            config = value
        elif key.startswith(FILE_PREFIX):
            files[_file_path(key.removeprefix(FILE_PREFIX), where)] = _base64(value, where)
        else:
            raise ProtocolError(
                f"{where}: not a load parameter reposerve knows (it takes config and "
                "file:<version>/<name>)"
            )
    if files and config is None:
        raise ProtocolError(
            f"load '{name}': file: parameters need a config parameter too: the files form a "
            "new model folder, and its configuration comes from parameters.config"
        )
    return LoadRequest(config, files)


def _file_path(text: str, where: str) -> str:
    """A path that stays inside the model folder. One leading slash means the folder
    itself (Triton's ``file:/1/model.py``, as its own tests write it), never the root."""
    if text.startswith("/") and not text.startswith("//"):
        text = text[1:]
    path = PurePosixPath(text)
    if (
        not text
        or path.is_absolute()
        or "\\" in text
        or any(part in ("", ".", "..") for part in text.split("/"))
    ):
        raise ProtocolError(f"{where}: expected a relative path like 1/model.py inside the model")
    if path.name in ("config.toml", "config.pbtxt") and len(path.parts) == 1:
        raise ProtocolError(f"{where}: the configuration comes from parameters.config")
    return text


def _base64(value: object, where: str) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError(f"{where}: expected the file content as a base64 string")
    try:
        return b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ProtocolError(f"{where}: not valid base64: {exc}") from exc
