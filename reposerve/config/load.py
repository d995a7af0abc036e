"""Read a model's config file (config.toml, or Triton's config.pbtxt) into a ModelConfig,
with errors that name the file, key and reason; ``validate`` holds the rules.

``add_sub/config.toml: dynamic_batching.max_queue_delay_microseconds: expected int >= 0, got -5``
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from reposerve.config.schema import ModelConfig
from reposerve.config.validate import validate_model_config
from reposerve.errors import ConfigError

CONFIG_FILES = ("config.toml", "config.pbtxt")  # native first: it wins when both exist


def find_config(folder: Path) -> Path | None:
    """The config file of a model folder: config.toml, else Triton's config.pbtxt."""
    return next((folder / name for name in CONFIG_FILES if (folder / name).is_file()), None)


def load_model_config(path: Path, label: str | None = None) -> ModelConfig:
    """Read and validate ``path`` (config.toml, or Triton's config.pbtxt); ``label`` is how
    errors name the file."""
    label = label or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: not UTF-8 text: {exc.reason}") from exc
    if path.suffix == ".pbtxt":
        from reposerve.config.pbtxt import parse_pbtxt  # protobuf only for Triton folders

        return parse_pbtxt(text, label, folder_name=path.parent.name)
    return parse_model_config(text, label, folder_name=path.parent.name)


def parse_model_config(text: str, label: str, folder_name: str | None = None) -> ModelConfig:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label}: invalid TOML: {exc}") from exc
    return validate_model_config(raw, label, folder_name)
