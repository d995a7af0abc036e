"""Where a model's instances run: instance groups -> one spec per process.

Triton's rules: no ``[[instance_group]]`` means one instance on each visible GPU, or one on
the CPU when there is none; ``kind = "auto"`` is the GPU when one is visible, else the CPU.
``gpus`` counts this server's CUDA devices (``gpus.py``), and each instance gets its device
by UUID. The groups as resolved here are what the model's config document shows.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from reposerve.config import InstanceGroup, ModelConfig
from reposerve.config.instances import instance_name
from reposerve.config.parameters import server_parameters
from reposerve.config.sequences import model_facing
from reposerve.errors import ConfigError
from reposerve.instance.spec import GpuDevice, InstanceSpec
from reposerve.repository.gpus import Gpus

GPU_INSTANCE_THREADS = 2  # intra-op threads of a GPU instance unless intra_op_threads says


class Placement(msgspec.Struct, frozen=True):
    config: ModelConfig  # the model's config with its instance groups resolved
    specs: list[InstanceSpec]  # one per instance process


def plan_instances(
    name: str, version: int, version_path: Path, backend: str, config: ModelConfig, gpus: Gpus
) -> Placement:
    """Resolve the instance groups against ``gpus`` and the cores this server may use, and
    give each instance process a spec, with a CPU thread budget that avoids oversubscription."""
    cores = sorted(os.sched_getaffinity(0))
    groups = [
        _resolve(name, index, group, gpus, cores)
        for index, group in enumerate(config.instance_group or _default_groups(gpus))
    ]
    config = msgspec.structs.replace(config, instance_group=groups)
    config_json = msgspec.json.encode(model_facing(config))  # the tensors it reads, all
    # Checked when the config was read (reposerve.config.parameters).
    override = server_parameters(config.parameters, name).intra_op_threads
    unpinned_cpu = sum(group.count for group in groups if group.kind in _HOST and not group.cpus)
    specs: list[InstanceSpec] = []
    for group in groups:
        if group.kind in _HOST:
            # CPU instances split the cores they may run on between them.
            sharing = group.count if group.cpus else unpinned_cpu
            threads = max(1, len(group.cpus or cores) // sharing)
            devices: list[GpuDevice | None] = [None]
        else:
            # A GPU instance mostly launches kernels and copies: a couple of threads serve
            # it, and sixteen GPU processes with all the cores each would starve the front.
            threads = min(GPU_INSTANCE_THREADS, len(group.cpus or cores))
            devices = [GpuDevice(number, gpus.visible[number].uuid) for number in group.gpus or ()]
        for device in devices:
            for _ in range(group.count):
                specs.append(
                    InstanceSpec(
                        model=name,
                        version=version,
                        version_path=str(version_path),
                        backend=backend,
                        config_json=config_json,
                        index=len(specs),
                        kind=group.kind,
                        gpu=device,
                        cpus=tuple(group.cpus or ()),
                        threads=override or threads,
                        execute_timeout_s=config.execution.timeout_seconds,
                        name=instance_name(name, config, len(specs)),
                    )
                )
    return Placement(config, specs)


# Kinds whose instances get no GPU from reposerve: they share the host's cores.
_HOST = ("cpu", "model")


def _default_groups(gpus: Gpus) -> list[InstanceGroup]:
    if gpus.visible:
        return [InstanceGroup(kind="gpu", gpus=list(range(len(gpus.visible))))]
    return [InstanceGroup(kind="cpu")]


def _resolve(
    name: str, index: int, group: InstanceGroup, gpus: Gpus, cores: list[int]
) -> InstanceGroup:
    """The group with its kind decided (cpu or gpu) and, on the GPU, its devices listed."""
    where = f"model '{name}': instance_group[{index}]"
    unknown = sorted(set(group.cpus or ()) - set(cores))
    if unknown:
        raise ConfigError(
            f"{where}.cpus: core(s) {unknown} not available (this server may use "
            f"{_ranges(cores)}). Hint: see `nproc` and the container's cpuset"
        )
    # A kind = "model" or "cpu" group names no GPUs (config.validate): none is assigned.
    if group.kind == "model":  # the model decides its device
        return msgspec.structs.replace(group, gpus=None)
    kind = group.kind
    if kind == "auto":
        kind = "gpu" if gpus.visible else "cpu"
    if kind == "cpu":
        return msgspec.structs.replace(group, kind="cpu", gpus=None)
    if not gpus.visible:
        raise ConfigError(
            f'{where} asks for kind "gpu" but no GPU is visible ({gpus.describe()}). '
            'Hint: use kind = "auto" to fall back to the CPU'
        )
    wanted = group.gpus if group.gpus is not None else list(range(len(gpus.visible)))
    missing = [device for device in wanted if device >= len(gpus.visible)]
    if missing:
        raise ConfigError(f"{where}.gpus: GPU(s) {missing} not visible ({gpus.describe()})")
    return msgspec.structs.replace(group, kind="gpu", gpus=wanted)


def _ranges(cores: list[int]) -> str:
    """``0-3,8`` for cores [0, 1, 2, 3, 8], as taskset and cpusets write them."""
    spans: list[list[int]] = []
    for core in cores:
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
