"""Triton's names for a model's instances, which its models and log lines use."""

from __future__ import annotations

from reposerve.config.schema import InstanceGroup, ModelConfig


def _place(config: ModelConfig, index: int) -> tuple[int, int, InstanceGroup | None]:
    """Instance ``index``'s group number, its number within the group, and the group."""
    left = index
    for number, group in enumerate(config.instance_group or ()):
        devices = len(group.gpus or ()) if group.kind == "gpu" else 1
        size = max(devices, 1) * group.count
        if left < size:
            return number, left % group.count, group
        left -= size
    return 0, index, None


def instance_name(model: str, config: ModelConfig, index: int) -> str:
    """Instance ``index``'s name: its group's name (``<model>_<group index>``, as the config
    document names groups) and its number within the group's count."""
    number, within, _ = _place(config, index)
    return f"{model}_{number}_{within}"


def instance_kind(config: ModelConfig, index: int) -> str:
    """The kind of instance ``index``'s group ("cpu" when the config names no groups)."""
    _, _, group = _place(config, index)
    return group.kind if group is not None else "cpu"
