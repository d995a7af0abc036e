"""Triton's model-config JSON (a load's ``config`` parameter, what ``/config`` answers) read
into a ModelConfig: protobuf's JSON mapping checks it against Triton's schema, then
``triton.config_from_triton`` reads it as it reads a config.pbtxt.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from google.protobuf import json_format

from reposerve.config.schema import ModelConfig
from reposerve.config.triton import config_from_triton
from reposerve.config.triton_schema import model_config_class
from reposerve.errors import ConfigError

_decoder = msgspec.json.Decoder()


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
