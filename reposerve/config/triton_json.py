"""reposerve's settings inside Triton's model-config JSON, in both directions.

``GET .../config`` answers in Triton's ``ModelConfig`` JSON, which Triton's tools parse with
unknown fields rejected, and a load request may send such a JSON config back (Triton's
``parameters.config`` override; Model Analyzer sends what it read, edited). Settings Triton's
schema has no field for travel in its free-form ``parameters`` map (string values), under
``reposerve.``-prefixed keys named after their config.toml path:

    reposerve.optimization.precision     "fp32" | "fp16" | "bf16"
    reposerve.execution.timeout_seconds  "120.0"
    reposerve.execution.isolate_failures "true" | "false"
    reposerve.instance_group.<i>.cpus    "[0, 1]"   (group i's pinned cores, when set)

The model's own ``[parameters]`` travel beside them under their own keys. Triton's values
are strings, reposerve's are typed: a value other than a string is written as JSON, and a
string is read back as JSON when it is JSON (``"4"`` -> 4, ``"true"`` -> True, tables), so
a Triton user's ``"4"`` means 4. A string that would itself read as JSON is written
JSON-quoted, so reading back what ``/config`` wrote always gives the value it had.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from google.protobuf import json_format

from reposerve.config.load import validate_model_config
from reposerve.config.schema import ModelConfig
from reposerve.config.triton import backend_parameters, from_triton
from reposerve.config.triton_schema import model_config_class
from reposerve.errors import ConfigError

PREFIX = "reposerve."
_PRECISION = "reposerve.optimization.precision"
_TIMEOUT = "reposerve.execution.timeout_seconds"
_ISOLATE = "reposerve.execution.isolate_failures"
_GROUP_CPUS = "reposerve.instance_group.{index}.cpus"

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
            f"{_TIMEOUT}, {_ISOLATE}, {_GROUP_CPUS.format(index='<i>')})"
        )
    index = int(parts[2])
    if index >= len(groups):
        raise ConfigError(
            f"{label}: parameters.{key}: there is no instance_group[{index}] "
            f"({len(groups)} group(s) given)"
        )
    groups[index]["cpus"] = value


def parse_triton_config(text: str, label: str, folder_name: str | None = None) -> ModelConfig:
    """A configuration in Triton's model-config JSON (a load's ``config`` parameter) as a
    ModelConfig, checked like a config.toml. Field names may be the protobuf's or their
    lowerCamelCase JSON names, 64-bit integers strings, as protobuf's JSON mapping allows.
    A field at its default value counts as absent (proto3: the two are the same message),
    so ``/config``'s full documents read back; a field set to anything reposerve has no
    equivalent for is an error naming it. Every field is checked against Triton's schema
    (protobuf's JSON mapping: types, ranges, enum names) before it is read, so a wrong type
    anywhere is an error naming the field, never a crash."""
    try:
        document = _decoder.decode(text)
        if not isinstance(document, dict):
            raise ConfigError(f"{label}: expected a JSON object (Triton's ModelConfig)")
        document = _without_defaults(_snake_keys(document))
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{label}: not valid JSON: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{label}: nested too deeply to be a model configuration") from None
    message = model_config_class()()
    try:
        json_format.ParseDict(document, message)
    except json_format.ParseError as exc:
        raise ConfigError(f"{label}: {_parse_error(str(exc))}") from None
    typed = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return config_from_triton(typed, label, folder_name)


_NO_FIELD = re.compile(r'has no field named "(?P<field>[^"]+)" at "(?P<at>[^"]*)"')


def _parse_error(text: str) -> str:
    """protobuf's JSON error, first line, in our words where it names an unknown field."""
    unknown = _NO_FIELD.search(text)
    if unknown:
        where = unknown["at"].removeprefix("ModelConfig").lstrip(".")
        path = f"{where}.{unknown['field']}" if where else unknown["field"]
        return f"{path}: not supported by reposerve"
    return text.splitlines()[0] if text else "not a Triton ModelConfig"


def config_from_triton(
    document: dict[str, Any], label: str, folder_name: str | None = None
) -> ModelConfig:
    """Triton's configuration (protobuf field names) as a ModelConfig, checked like a
    config.toml: the fields by ``from_triton``, the parameters map as above."""
    document = dict(document)
    parameters = document.pop("parameters", None) or {}
    if not isinstance(parameters, dict):
        raise ConfigError(f"{label}: parameters: expected an object of {{key: string_value}}")
    table = from_triton(document, label)
    apply_triton_parameters(table, parameters, label)
    backend_parameters(table, label)
    return validate_model_config(table, label, folder_name)


# Fields whose value is a map: their keys are names (tensors, parameters), never renamed.
_MAPS = frozenset(
    {"parameters", "inputs", "cc_model_filenames", "metric_tags", "input_map", "output_map"}
)
_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")


def _snake_keys(node: Any, is_map: bool = False) -> Any:
    if isinstance(node, list):
        return [_snake_keys(item) for item in node]
    if not isinstance(node, dict):
        return node
    renamed = {}
    for key, value in node.items():
        field = key if is_map else _CAMEL.sub(r"_\1", key).lower()
        renamed[field] = _snake_keys(value, is_map=not is_map and field in _MAPS)
    return renamed


def _without_defaults(node: Any) -> Any:
    """``node`` without the fields at proto3 defaults (false, 0, "", []); empty messages
    stay, since a message's presence means something (``dynamic_batching {}`` is on)."""
    if isinstance(node, list):
        return [_without_defaults(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {key: _without_defaults(value) for key, value in node.items() if not _is_default(value)}


def _is_default(value: Any) -> bool:
    return not isinstance(value, dict) and value in (None, False, 0, "", [])
