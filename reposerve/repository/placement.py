"""Where a model's instances run: instance groups -> one spec per process.

GPUs are found without importing any framework: the NVIDIA driver lists them under
/proc/driver/nvidia/gpus, and CUDA_VISIBLE_DEVICES narrows what this server may use.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from reposerve.config import ModelConfig
from reposerve.errors import ConfigError
from reposerve.instance.process import InstanceSpec

_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
GPU_INSTANCE_THREADS = 2  # intra-op threads of a GPU instance unless intra_op_threads says


def visible_gpus() -> list[int]:
    """The driver's ids of the GPUs this process may use, in CUDA order: CUDA device N of
    this server is ``visible_gpus()[N]``."""
    try:
        present = len(list(_NVIDIA_GPUS.iterdir()))
    except OSError:
        present = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(present))
    indices = [int(part) for part in visible.split(",") if part.strip().isdigit()]
    return [index for index in indices if index < present]


def plan_instances(
    name: str, version: int, version_path: Path, backend: str, config: ModelConfig
) -> list[InstanceSpec]:
    """One spec per instance process, with a CPU thread budget that avoids oversubscription."""
    gpus = visible_gpus()
    placements: list[tuple[str, int | None]] = []
    for index, group in enumerate(config.instance_group):
        kind = group.kind
        if kind == "auto":
            kind = "gpu" if gpus else "cpu"
        if kind == "cpu":
            placements += [("cpu", None)] * group.count
            continue
        if not gpus:
            raise ConfigError(
                f"model '{name}': instance_group[{index}] asks for kind \"gpu\" but no GPU is "
                'visible. Hint: use kind = "auto" to fall back to the CPU'
            )
        # `gpus` counts CUDA devices as this server sees them; each instance process gets
        # the driver's id of its device in CUDA_VISIBLE_DEVICES.
        wanted = group.gpus if group.gpus is not None else range(len(gpus))
        missing = [device for device in wanted if device >= len(gpus)]
        if missing:
            raise ConfigError(
                f"model '{name}': instance_group[{index}].gpus: GPU(s) {missing} not visible "
                f"(this server sees {len(gpus)}: 0..{len(gpus) - 1})"
            )
        placements += [("gpu", gpus[device]) for device in wanted for _ in range(group.count)]
    config_json = msgspec.json.encode(config)
    cpu_threads, gpu_threads = _threads(config, sum(1 for kind, _ in placements if kind == "cpu"))
    return [
        InstanceSpec(
            model=name,
            version=version,
            version_path=str(version_path),
            backend=backend,
            config_json=config_json,
            index=index,
            kind=kind,
            gpu=gpu,
            threads=cpu_threads if kind == "cpu" else gpu_threads,
            execute_timeout_s=config.execution.timeout_seconds,
        )
        for index, (kind, gpu) in enumerate(placements)
    ]


def _threads(config: ModelConfig, cpu_instances: int) -> tuple[int, int]:
    """Intra-op threads for (each cpu instance, each gpu instance).

    CPU instances split the cores between them. A GPU instance mostly launches kernels and
    copies: a couple of threads serve it, and sixteen GPU processes with all the cores each
    would starve the HTTP front. ``[parameters] intra_op_threads`` sets both.
    """
    override = config.parameters.get("intra_op_threads")
    if override is not None:
        if type(override) is not int or override < 1:
            raise ConfigError(f"parameters.intra_op_threads: expected int >= 1, got {override!r}")
        return override, override
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    return max(1, cores // max(cpu_instances, 1)), min(GPU_INSTANCE_THREADS, cores)
