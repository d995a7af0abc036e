"""A ModelConfig written back as config.toml (what ``reposerve convert`` prints).

Only what differs from the defaults is written, in the order DESIGN.md shows the keys,
so the file reads like one a person wrote; loading it gives the same ModelConfig.
"""

from __future__ import annotations

from typing import Any

import msgspec

from reposerve.config.schema import ModelConfig

_ARRAYS_OF_TABLES = ("input", "output", "instance_group", "warmup", "step")
_TABLES = ("dynamic_batching", "sequence_batching", "optimization", "execution", "lifecycle")
_encoder = msgspec.json.Encoder()


def to_toml(config: ModelConfig) -> str:
    values = msgspec.to_builtins(config)
    defaults = msgspec.to_builtins(ModelConfig())
    lines: list[str] = []
    for key, value in values.items():
        if key in (*_ARRAYS_OF_TABLES, *_TABLES, "parameters") or value == defaults.get(key):
            continue
        lines.append(f"{key} = {_value(value)}")
    for key in _ARRAYS_OF_TABLES:
        for table in values.get(key) or []:
            lines += ["", f"[[{key}]]", *_pairs(table, _section_defaults(key))]
    for key in _TABLES:
        table = values.get(key)
        if table is not None and table != defaults.get(key):
            # its lists of tables (sequence_batching.control_input) as arrays of tables
            nested = {k: v for k, v in table.items() if v and _is_tables(v)}
            plain = {k: v for k, v in table.items() if k not in nested}
            lines += ["", f"[{key}]", *_pairs(plain, _section_defaults(key))]
            for name, entries in nested.items():
                for entry in entries:
                    lines += ["", f"[[{key}.{name}]]", *_pairs(entry, {})]
    lines += _parameters("parameters", values.get("parameters") or {})
    return "\n".join(lines).lstrip("\n") + "\n"


def _is_tables(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _struct(info: msgspec.inspect.Type) -> msgspec.inspect.StructType:
    """The Struct ``info`` is, or holds as a list's items or an Optional's value."""
    while not isinstance(info, msgspec.inspect.StructType):
        if isinstance(info, msgspec.inspect.ListType):
            info = info.item_type
        elif isinstance(info, msgspec.inspect.UnionType):  # Optional[...]
            info = next(t for t in info.types if not isinstance(t, msgspec.inspect.NoneType))
        else:
            raise TypeError(f"{info} holds no Struct")
    return info


def _section_defaults(key: str) -> dict[str, Any]:
    """The defaults of a section's fields (one entry's, for an array of tables), so they
    are left out too."""
    fields = _struct(msgspec.inspect.type_info(ModelConfig)).fields
    info = _struct(next(f for f in fields if f.name == key).type)
    defaults = {}
    for field in info.fields:
        if field.default is not msgspec.NODEFAULT:
            defaults[field.name] = msgspec.to_builtins(field.default)
        elif field.default_factory is not msgspec.NODEFAULT:
            defaults[field.name] = msgspec.to_builtins(field.default_factory())
    return defaults


def _pairs(table: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    return [
        f"{key} = {_value(value)}"
        for key, value in table.items()
        if value is not None and (key not in defaults or value != defaults[key])
    ]


def _parameters(path: str, table: dict[str, Any]) -> list[str]:
    """[parameters] with its sub-tables (e.g. parameters.onnxruntime.tensorrt) as sections."""
    plain = {key: value for key, value in table.items() if not isinstance(value, dict)}
    nested = {key: value for key, value in table.items() if isinstance(value, dict)}
    lines = ["", f"[{path}]", *_pairs(plain, {})] if plain or not nested else []
    for key, value in nested.items():
        lines += _parameters(f"{path}.{_key(key)}", value)
    return lines if table else []


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _value(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _encoder.encode(value).decode()  # JSON escapes are TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):  # TOML has no null: an unset key is left out
        pairs = [f"{_key(k)} = {_value(v)}" for k, v in value.items() if v is not None]
        return "{ " + ", ".join(pairs) + " }"
    return repr(value)
