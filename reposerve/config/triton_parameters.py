"""reposerve's settings inside Triton's model-config ``parameters`` map, both directions.

``GET .../config`` answers in Triton's ``ModelConfig`` JSON, which Triton's tools parse with
unknown fields rejected, and a load request may send such a JSON config back (Triton's
``parameters.config`` override; Model Analyzer sends what it read, edited). Settings Triton's
schema has no field for travel in its free-form ``parameters`` map (string values), under
``reposerve.``-prefixed keys named after their config.toml path:

    reposerve.optimization.precision     "fp32" | "fp16" | "bf16"
    reposerve.execution.timeout_seconds  "120.0"
    reposerve.execution.isolate_failures "true" | "false"
    reposerve.instance_group.<i>.cpus    "[0, 1]"   (group i's pinned cores, when set)
    reposerve.lifecycle.pinned           "true" | "false"
    reposerve.dynamic_batching.<key>     pad, buckets, lengths_input, lengths_datatype,
                                         unpad (variable-length batching; when pad is set)
    reposerve.openai.<key>               kind, chat_template, input, output, max_tokens
                                         (the OpenAI-compatible routes; when kind is set)

The model's own ``[parameters]`` travel beside them under their own keys. Triton's values
are strings, reposerve's are typed: a value other than a string is written as JSON, and a
string is read back as JSON when it is JSON (``"4"`` -> 4, ``"true"`` -> True, tables), so
a Triton user's ``"4"`` means 4. A string that would itself read as JSON is written
JSON-quoted, so reading back what ``/config`` wrote always gives the value it had.
"""

from __future__ import annotations

from typing import Any

import msgspec

from reposerve.config.schema import ModelConfig
from reposerve.errors import ConfigError

PREFIX = "reposerve."
_PRECISION = "reposerve.optimization.precision"
_TIMEOUT = "reposerve.execution.timeout_seconds"
_ISOLATE = "reposerve.execution.isolate_failures"
_GROUP_CPUS = "reposerve.instance_group.{index}.cpus"
_PINNED = "reposerve.lifecycle.pinned"
_BATCHING = "reposerve.dynamic_batching."
_PADDING_KEYS = ("pad", "buckets", "lengths_input", "lengths_datatype", "unpad")
_OPENAI = "reposerve.openai."
_OPENAI_KEYS = ("kind", "chat_template", "input", "output", "max_tokens")

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def encode_value(value: Any) -> str:
    """One parameter value as Triton's ``string_value`` (see the module docstring)."""
    if isinstance(value, str):
        try:
            _decoder.decode(value)
        except msgspec.DecodeError:
            return value  # plain text stays as it is
    return _encoder.encode(value).decode()


def decode_value(text: str) -> Any:
    """The inverse of ``encode_value``; also reads Triton's ``"4"``/``"true"`` as typed.
    Text that is not JSON, or nested too deeply to be a setting, stays text."""
    try:
        return _decoder.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return text


def to_triton_parameters(config: ModelConfig) -> dict[str, dict[str, str]]:
    """Triton's ``parameters`` map for ``config``: its own ``[parameters]``, then the
    reposerve-only settings (always, so a tool that edits and sends the config back keeps
    them)."""
    values: dict[str, Any] = dict(config.parameters)
    values[_PRECISION] = config.optimization.precision
    values[_TIMEOUT] = config.execution.timeout_seconds
    values[_ISOLATE] = config.execution.isolate_failures
    values[_PINNED] = config.lifecycle.pinned
    batching = config.dynamic_batching
    if batching is not None and batching.pad:  # Triton's dynamic_batching has no such field
        for key in _PADDING_KEYS:
            if getattr(batching, key) is not None:
                values[_BATCHING + key] = getattr(batching, key)
    if config.openai is not None:
        for key in _OPENAI_KEYS:
            if getattr(config.openai, key) is not None:
                values[_OPENAI + key] = getattr(config.openai, key)
    for index, group in enumerate(config.instance_group or ()):
        if group.cpus:
            values[_GROUP_CPUS.format(index=index)] = group.cpus
    return {key: {"string_value": encode_value(value)} for key, value in values.items()}


def apply_triton_parameters(
    table: dict[str, Any], parameters: dict[str, Any], label: str
) -> dict[str, Any]:
    """Put Triton's ``parameters`` map (key -> ``{"string_value": ...}``) into ``table``, a
    config.toml table: ``reposerve.`` keys become the settings they name, the others the
    model's ``[parameters]``. An unknown ``reposerve.`` key is an error naming it."""
    own: dict[str, Any] = {}
    for key, entry in parameters.items():
        text = entry.get("string_value", "") if isinstance(entry, dict) else entry
        if not isinstance(text, str):
            raise ConfigError(f'{label}: parameters.{key}: expected {{"string_value": str}}')
        value = decode_value(text)
        if not key.startswith(PREFIX):
            own[key] = value
        elif key == _PRECISION:
            table.setdefault("optimization", {})["precision"] = value
        elif key in (_TIMEOUT, _ISOLATE):
            table.setdefault("execution", {})[key.rsplit(".", 1)[1]] = value
        elif key == _PINNED:
            table.setdefault("lifecycle", {})["pinned"] = value
        elif key.startswith(_BATCHING) and key[len(_BATCHING) :] in _PADDING_KEYS:
            table.setdefault("dynamic_batching", {})[key[len(_BATCHING) :]] = value
        elif key.startswith(_OPENAI) and key[len(_OPENAI) :] in _OPENAI_KEYS:
            table.setdefault("openai", {})[key[len(_OPENAI) :]] = value
        else:
            _group_cpus(table, key, value, label)
    if own:  # beside what other fields put there (the TensorRT accelerator's options)
        table.setdefault("parameters", {}).update(own)
    return table


def _group_cpus(table: dict[str, Any], key: str, value: Any, label: str) -> None:
    parts = key.split(".")
    groups = table.get("instance_group", [])
    known = len(parts) == 4 and parts[1] == "instance_group" and parts[3] == "cpus"
    if not known or not parts[2].isdigit():
        raise ConfigError(
            f"{label}: parameters.{key}: unknown reposerve setting (known: {_PRECISION}, "
            f"{_TIMEOUT}, {_ISOLATE}, {_PINNED}, {_GROUP_CPUS.format(index='<i>')}, "
            f"{_BATCHING}{{{','.join(_PADDING_KEYS)}}}, {_OPENAI}{{{','.join(_OPENAI_KEYS)}}})"
        )
    index = int(parts[2])
    if index >= len(groups):
        raise ConfigError(
            f"{label}: parameters.{key}: there is no instance_group[{index}] "
            f"({len(groups)} group(s) given)"
        )
    groups[index]["cpus"] = value
