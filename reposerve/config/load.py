"""Load a config.toml into a ModelConfig, with errors that name the file, key and reason.

``add_sub/config.toml: dynamic_batching.max_queue_delay_microseconds: expected int >= 0, got -5``

Every rule a load applies to the config alone is applied here (``[parameters]`` and what
the backend supports in ``parameters``), so ``reposerve check`` refuses what a load does.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from reposerve.config.ensemble import check_ensemble
from reposerve.config.parameters import check_parameters
from reposerve.config.schema import ModelConfig, TensorConfig
from reposerve.config.tables import describe
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


def validate_model_config(
    raw: dict[str, Any], label: str, folder_name: str | None = None
) -> ModelConfig:
    """Check parsed TOML against the schema and the cross-field rules."""
    try:
        config = msgspec.convert(raw, ModelConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{label}: {describe(exc, raw)}") from exc
    problem = _check(config, folder_name)
    if problem:
        raise ConfigError(f"{label}: {problem}")
    check_parameters(config, label)
    return config


def _check(config: ModelConfig, folder_name: str | None) -> str | None:
    """Rules that span fields; returns the first problem as ``key: reason``."""
    if config.name is not None and folder_name is not None and config.name != folder_name:
        return f'name: "{config.name}" does not match the model folder "{folder_name}"'
    policy = config.version_policy
    chosen = [key for key in ("latest", "all", "specific") if getattr(policy, key) is not None]
    if len(chosen) > 1:
        return f"version_policy: set one of latest, all, specific (got {', '.join(chosen)})"
    if policy.all is False:
        return "version_policy.all: must be true when given (use latest or specific instead)"
    for section in ("input", "output"):
        seen: set[str] = set()
        for index, tensor in enumerate(getattr(config, section)):
            if tensor.name in seen:
                return f'{section}[{index}].name: duplicate {section} "{tensor.name}"'
            seen.add(tensor.name)
            if section == "input" and tensor.label_filename is not None:
                return f"input[{index}].label_filename: only outputs have class labels"
            problem = _check_reshape(tensor)
            if problem:
                return f"{section}[{index}].reshape: {problem}"
    return check_ensemble(config) or _check_batching(config)


def _check_reshape(tensor: TensorConfig) -> str | None:
    """Triton's rule: a reshape holds as many elements as the shape it stands for."""
    if tensor.reshape is None:
        return None
    if tensor.reshape.count(-1) > 1:
        return f"{tensor.reshape}: at most one -1 (the rest of the elements)"
    if -1 in tensor.shape or -1 in tensor.reshape:
        if (-1 in tensor.shape) != (-1 in tensor.reshape):
            return f"{tensor.reshape}: variable-size only where shape {tensor.shape} is too"
        return None
    if math.prod(tensor.reshape) != math.prod(tensor.shape):
        return (
            f"{tensor.reshape} holds {math.prod(tensor.reshape)} elements, shape "
            f"{tensor.shape} holds {math.prod(tensor.shape)}"
        )
    return None


def _check_batching(config: ModelConfig) -> str | None:
    batching = config.dynamic_batching
    if batching is not None:
        if config.max_batch_size == 0:
            return "dynamic_batching: needs max_batch_size > 0 (0 means no batch dimension)"
        for size in batching.preferred_batch_size:
            if size > config.max_batch_size:
                return (
                    f"dynamic_batching.preferred_batch_size: {size} exceeds "
                    f"max_batch_size {config.max_batch_size}"
                )
        if batching.default_priority_level > batching.priority_levels:
            return (
                f"dynamic_batching.default_priority_level: {batching.default_priority_level} "
                f"exceeds priority_levels {batching.priority_levels}"
            )
    input_names = {tensor.name for tensor in config.input}
    for index, warmup in enumerate(config.warmup):
        limit = max(config.max_batch_size, 1)
        if warmup.batch_size > limit:
            return f"warmup[{index}].batch_size: {warmup.batch_size} exceeds the limit {limit}"
        for name in warmup.inputs:
            if input_names and name not in input_names:
                return f'warmup[{index}].inputs: "{name}" is not an input of this model'
    return None
