"""What an instance process is: its model version, its place (CPU cores, a GPU), its
share of the machine, and its execution timeout."""

from __future__ import annotations

import msgspec


class GpuDevice(msgspec.Struct, frozen=True):
    """The GPU, or MIG device, an instance runs on."""

    index: int  # the server's CUDA device number: what `gpus` in an instance group counts
    uuid: str  # GPU-... or MIG-...: the process's CUDA_VISIBLE_DEVICES, so it sees only this


class InstanceSpec(msgspec.Struct, frozen=True):
    """Everything needed to start one instance process."""

    model: str
    version: int
    version_path: str
    backend: str
    config_json: bytes
    index: int
    kind: str  # "cpu" or "gpu"
    gpu: GpuDevice | None
    cpus: tuple[int, ...]  # the cores it is pinned to; () = not pinned
    threads: int
    execute_timeout_s: float  # 0 = none
    name: str = ""  # Triton's name for it (<model>_<group>_<n>), as its models see it

    @property
    def label(self) -> str:
        where = f"gpu {self.gpu.index} {self.gpu.uuid}" if self.gpu is not None else "cpu"
        return f"model '{self.model}' version {self.version} instance {self.index} ({where})"
