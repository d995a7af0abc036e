"""The node: its GPUs as nvidia-smi lists them, what they hold, and whether torch can use
them; and whether a process has gone."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import msgspec


class Gpu(msgspec.Struct, frozen=True):
    index: int  # nvidia-smi's (NVML's) index
    uuid: str
    name: str
    memory_total_mib: int


def nvidia_smi(*query: str) -> list[list[str]]:
    """Rows of an ``nvidia-smi --query-...`` in CSV without header or units."""
    done = subprocess.run(
        ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(query)}: exit {done.returncode}: {done.stderr}")
    return [
        [field.strip() for field in line.split(",")]
        for line in done.stdout.splitlines()
        if line.strip() and "," in line  # "No running processes found" has no comma
    ]


def find_gpus() -> tuple[list[Gpu], list[Gpu], str]:
    """The GPUs nvidia-smi lists; those this process's CUDA_VISIBLE_DEVICES leaves visible,
    in CUDA's order (reposerve's ``gpus = [N]`` counts the same way); why there are none."""
    if shutil.which("nvidia-smi") is None:
        return [], [], "no GPU: nvidia-smi is not on PATH"
    try:
        rows = nvidia_smi("--query-gpu=index,uuid,name,memory.total")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return [], [], f"no GPU: nvidia-smi failed ({exc})"
    found = [Gpu(int(row[0]), row[1], row[2], int(float(row[3]))) for row in rows]
    if not found:
        return [], [], "no GPU: nvidia-smi lists none"
    setting = os.environ.get("CUDA_VISIBLE_DEVICES")
    if setting is None:
        return found, found, ""
    visible: list[Gpu] = []
    # CUDA's rule, for the forms a session would set: indices or GPU- UUID prefixes; the
    # first entry that names nothing ends the list.
    for entry in (part.strip() for part in setting.split(",")):
        matches = [
            gpu
            for gpu in found
            if (entry.isdigit() and gpu.index == int(entry))
            or (entry.startswith("GPU-") and gpu.uuid.startswith(entry))
        ]
        if len(matches) != 1 or matches[0] in visible:
            break
        visible.append(matches[0])
    if not visible:
        why = f"no GPU: CUDA_VISIBLE_DEVICES={setting!r} leaves none of {len(found)} visible"
        return found, [], why
    return found, visible, ""


def memory_used_mib(uuid: str) -> int:
    rows = nvidia_smi("--query-gpu=uuid,memory.used")
    return next(int(float(row[1])) for row in rows if row[0] == uuid)


def utilization_pct(uuid: str) -> int | None:
    """utilization.gpu of the GPU ``uuid``; None when nvidia-smi does not list it."""
    rows = nvidia_smi("--query-gpu=uuid,utilization.gpu")
    return next((int(row[1]) for row in rows if row[0] == uuid), None)


def compute_apps() -> list[tuple[int, str, int]]:
    """(pid, GPU UUID, used MiB) of every process nvidia-smi shows holding a context."""
    rows = nvidia_smi("--query-compute-apps=pid,gpu_uuid,used_memory")
    return [(int(row[0]), row[1], int(float(row[2] or 0))) for row in rows if row[0].isdigit()]


def torch_uuid(value: str) -> str:
    """torch prints a device UUID without nvidia-smi's ``GPU-`` prefix."""
    return value if value.startswith(("GPU-", "MIG-")) else f"GPU-{value}"


def process_gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class Node:
    """What this machine offers: the GPUs, and whether this torch can use them."""

    def __init__(self) -> None:
        self.all_gpus, self.gpus, self.no_gpu_reason = find_gpus()
        try:
            import torch

            self.torch: str | None = str(torch.__version__)
            # Initialises the driver only: no context, no device memory taken.
            self.cuda = torch.cuda.is_available()
        except ImportError:
            self.torch, self.cuda = None, False
