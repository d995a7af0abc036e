"""What each loaded model version holds, measured: its instance processes' host memory
(their proportional set size, so pages they share, the interpreter and libraries, count
once across them) and, on a node with GPUs, the GPU memory NVML lists for them.

Each measurement walks page tables and may start the NVML probe process: run it off the
event loop. The memory budgets (``residency.py``) decide by these numbers; ``/stats``
(Triton's ``memory_usage``), the repository index and the metrics show them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from reposerve.repository import gpus
from reposerve.statistics import MemoryUsage


class Footprint(msgspec.Struct, frozen=True):
    host: int = 0  # bytes
    gpu: dict[int, int] = {}  # the server's CUDA device number -> bytes

    def __add__(self, other: Footprint) -> Footprint:
        gpu = dict(self.gpu)
        for device, nbytes in other.gpu.items():
            gpu[device] = gpu.get(device, 0) + nbytes
        return Footprint(self.host + other.host, gpu)

    def usage(self) -> list[MemoryUsage]:
        """In Triton's ``memory_usage`` shape; [] when never measured (an ensemble)."""
        if not self.host and not self.gpu:
            return []
        return [
            MemoryUsage("CPU", 0, self.host),
            *(MemoryUsage("GPU", device, n) for device, n in sorted(self.gpu.items())),
        ]


def host_memory_total() -> int:
    """The machine's memory, or the container's limit when it sets a lower one (a share
    of more than the container may hold would end in the OOM killer)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def pss_bytes(pid: int) -> int:
    """The proportional set size of ``pid`` (0 when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def version_footprint(version: Any, on_gpus: Mapping[int, Mapping[int, int]]) -> Footprint:
    """A loaded version's footprint; ``on_gpus``: pid -> {NVML GPU index: bytes}. An
    instance on a GPU sees only that device, so what it holds is counted there."""
    host = 0
    gpu: dict[int, int] = {}
    devices = gpus.discover().visible if on_gpus else ()
    for instance in version.instances:
        pid = instance.pid
        if not pid:
            continue
        host += pss_bytes(pid)
        for nvml_index, nbytes in on_gpus.get(pid, {}).items():
            device = instance.spec.gpu.index if instance.spec.gpu else _number(devices, nvml_index)
            if device is not None:
                gpu[device] = gpu.get(device, 0) + nbytes
    return Footprint(host, gpu)


def _number(devices: Sequence[gpus.Device], nvml_index: int) -> int | None:
    """The server's device number of NVML's GPU ``nvml_index`` (a CPU instance sees every
    GPU of the server's)."""
    return next((n for n, device in enumerate(devices) if device.gpu == nvml_index), None)


def measure(serving: Mapping[str, Sequence[Any]]) -> dict[str, Footprint]:
    """Each model's footprint now, ``serving``: name -> its loaded versions (ensembles hold
    none of their own). Each version keeps its own, for ``/stats`` and the index. PSS moves
    as shared pages lose their other users and arenas grow: measure again when deciding."""
    on_gpus = gpus.process_memory() if gpus.discover().visible else {}
    measured: dict[str, Footprint] = {}
    for name, versions in serving.items():
        if any(v.pipeline for v in versions):
            continue
        total = Footprint()
        for version in versions:
            version.footprint = version_footprint(version, on_gpus)
            total = total + version.footprint
        measured[name] = total
    return measured


def folder_bytes(roots: Sequence[Path], name: str) -> int:
    """What a model never loaded before is expected to take: its files' size (its weights,
    mostly); 0 when the folder cannot be read (its load will say why)."""
    for root in roots:
        folder = root / name
        if folder.is_dir():
            return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    return 0
