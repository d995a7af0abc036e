"""Triton's names for a model's instances, which its models and log lines use."""

from __future__ import annotations

from reposerve.config.schema import ModelConfig


def instance_name(model: str, config: ModelConfig, index: int) -> str:
    """Instance ``index``'s name: its group's name (``<model>_<group index>``, as the config
    document names groups) and its number within the group's count."""
    left = index
    for number, group in enumerate(config.instance_group or ()):
        devices = len(group.gpus or ()) if group.kind == "gpu" else 1
        size = max(devices, 1) * group.count
        if left < size:
            return f"{model}_{number}_{left % group.count}"
        left -= size
    return f"{model}_0_{index}"
