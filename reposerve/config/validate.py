"""Every rule on a config as read, whatever file it came from (config.toml, config.pbtxt,
Triton's JSON): the schema, the rules that span fields, an ensemble's steps, and
``[parameters]`` with what the backend supports. ``reposerve check`` and a load both come
through here, so they refuse the same configs in the same words, before any process starts.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from reposerve.config.ensemble import check_ensemble
from reposerve.config.openai import check_openai
from reposerve.config.padding import check_padding
from reposerve.config.parameters import check_parameters
from reposerve.config.schema import ModelConfig, TensorConfig
from reposerve.config.sequences import check_sequence_batching
from reposerve.config.tables import describe
from reposerve.errors import ConfigError


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
    return (
        check_ensemble(config)
        or _check_groups(config)
        or _check_batching(config)
        or check_padding(config)
        or check_openai(config)
        or check_sequence_batching(config)
    )


def _check_groups(config: ModelConfig) -> str | None:
    """A group that runs on no GPU lists none (which GPUs exist is placement's to see)."""
    for index, group in enumerate(config.instance_group or ()):
        if group.kind == "model" and group.gpus:
            return (
                f'instance_group[{index}].gpus: a kind = "model" group picks its own device. '
                'Hint: remove gpus, or use kind = "gpu"'
            )
        if group.kind == "cpu" and group.gpus:
            return (
                f'instance_group[{index}].gpus: a kind = "cpu" group runs on no GPU. Hint: '
                'remove gpus, or use kind = "gpu" (or "auto")'
            )
    return None


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
