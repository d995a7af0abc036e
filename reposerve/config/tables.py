"""msgspec conversion with our errors: ``file: key.path: reason, got value``.

Shared by the config schema (``load``) and the tables of ``[parameters]`` that backends
document (``onnx_options``, ``torch_options``, ``parameters``).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from reposerve.errors import ConfigError

_PATH_TOKEN = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_AT_PATH = re.compile(r"^(?P<reason>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
Table = TypeVar("Table", bound=msgspec.Struct)


def convert_table(raw: Any, kind: type[Table], label: str, key: str) -> Table:
    """Validate one table of the free-form ``[parameters]`` (a backend's options) against
    ``kind``, with the same ``file: key: reason`` errors as the config itself; ``key`` is
    the table's dotted path. An unknown key also lists the allowed ones, since these names
    come from the backend's documentation, not from DESIGN.md."""
    if isinstance(raw, dict):
        for name in raw:
            if name not in kind.__struct_fields__:
                allowed = ", ".join(kind.__struct_fields__)
                raise ConfigError(f"{label}: {key}.{name}: unknown key (allowed: {allowed})")
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{label}: {describe(exc, raw, key)}") from exc


def describe(exc: msgspec.ValidationError, raw: Any, root: str = "") -> str:
    """Rewrite msgspec's message as ``key.path: reason, got value``; ``root`` is the dotted
    path of ``raw`` in the whole config."""
    match = _AT_PATH.match(str(exc))
    assert match is not None  # the pattern matches any string
    reason = match["reason"].replace("`", "")
    reason = reason[0].lower() + reason[1:]
    dotted = ".".join(filter(None, [root, (match["path"] or "").lstrip(".")]))
    if reason.startswith("object contains unknown field "):
        key = reason.removeprefix("object contains unknown field ")
        return f"{_join(dotted, key)}: unknown key"
    if reason.startswith("object missing required field "):
        key = reason.removeprefix("object missing required field ")
        return f"{_join(dotted, key)}: required key is missing"
    if ", got " not in reason and not reason.startswith("invalid enum value"):
        found, value = _lookup(raw, match["path"] or "")
        if found:
            reason = f"{reason}, got {_show(value)}"
    return f"{dotted or '(top level)'}: {reason}"


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _lookup(raw: Any, path: str) -> tuple[bool, Any]:
    node = raw
    for key, index in _PATH_TOKEN.findall(path):
        try:
            node = node[key] if key else node[int(index)]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, node


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)
