"""Read Triton's ``config.pbtxt`` (protobuf text format of ``ModelConfig``) into the same
ModelConfig a ``config.toml`` gives, with errors that name the file and the field."""

from __future__ import annotations

import re

from google.protobuf import json_format, text_format

from reposerve.config.schema import ModelConfig
from reposerve.config.triton import config_from_triton
from reposerve.config.triton_schema import model_config_class
from reposerve.errors import ConfigError

_NO_FIELD = re.compile(r'has no field named "(?P<field>[^"]+)"')


def parse_pbtxt(text: str, label: str, folder_name: str | None = None) -> ModelConfig:
    message = model_config_class()()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        unknown = _NO_FIELD.search(str(exc))
        if unknown:  # a Triton field left out of model_config.proto: reposerve has no equivalent
            raise ConfigError(
                f"{label}: {exc.GetLine()}:{exc.GetColumn()}: {unknown['field']}: not "
                "supported by reposerve (or not a Triton ModelConfig field)"
            ) from exc
        raise ConfigError(f"{label}: {exc}") from exc
    document = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return config_from_triton(document, label, folder_name)
