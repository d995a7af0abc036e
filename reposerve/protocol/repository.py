"""The requests of Triton's model repository extension: index, load and unload.

The HTTP bodies are decoded here, and a gRPC request's parameters (as plain values) go
through the same checks, so both fronts refuse the same loads with the same message.

A load may carry ``parameters``:

- ``config``: the model's configuration as Triton's model-config JSON (a string), used for
  this load instead of the model folder's;
- ``file:<path>``: one file of the model folder to load from instead of the repository's
  (``file:1/model.py``, or ``file:/1/model.py``): base64 in JSON, bytes over gRPC; Triton
  requires ``config`` with them, since the folder they form holds no configuration of its
  own.

Any other load parameter is an error naming it: a load must not quietly differ from the
one asked. An unload takes ``unload_dependents`` (a bool) and ignores the rest, as Triton.
"""

from __future__ import annotations

import binascii
from base64 import b64decode
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import TypeVar

import msgspec

from reposerve.errors import ProtocolError
from reposerve.operations import IndexRequest, LoadRequest, UnloadRequest

FILE_PREFIX = "file:"

T = TypeVar("T")

# What reads a file parameter's value as the file's bytes: (value, where) -> content.
FileContent = Callable[[object, str], bytes]


class _Body(msgspec.Struct):
    parameters: dict[str, object] | None = None


def decode_index_request(body: bytes) -> IndexRequest:
    return _decode(body, IndexRequest, "repository index")


def decode_load_request(name: str, body: bytes) -> LoadRequest:
    """An HTTP load body, its files base64."""
    parameters = _decode(body, _Body, f"load '{name}'").parameters or {}
    return load_request(name, parameters, _base64)


def decode_unload_request(name: str, body: bytes) -> UnloadRequest:
    return unload_request(name, _decode(body, _Body, f"unload '{name}'").parameters or {})


def load_request(name: str, parameters: Mapping[str, object], content: FileContent) -> LoadRequest:
    """A load of ``name`` from its parameters; ``content`` reads a file's value."""
    config = None
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        where = f"load '{name}': parameters.{key}"
        if key == "config":
            if not isinstance(value, str):
                raise ProtocolError(f"{where}: expected the model config as a JSON string")
            config = value
        elif key.startswith(FILE_PREFIX):
            files[_file_path(key.removeprefix(FILE_PREFIX), where)] = content(value, where)
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
    return LoadRequest(name, config, files)


def unload_request(name: str, parameters: Mapping[str, object]) -> UnloadRequest:
    dependents = parameters.get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise ProtocolError(f"unload '{name}': parameter unload_dependents must be a bool")
    return UnloadRequest(name, dependents)


def _decode(body: bytes, kind: type[T], what: str) -> T:
    try:
        return msgspec.json.decode(body or b"{}", type=kind)
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ProtocolError(f"{what}: malformed request JSON: {exc}") from exc


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
