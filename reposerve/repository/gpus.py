"""Which GPUs this server may use, numbered as CUDA numbers them, found without CUDA.

``nvml.py`` runs once as a short probe process and lists the node's GPUs and MIG devices
(``REPOSERVE_GPU_PROBE``, when set, is run instead: a command whose stdout is that JSON, for
tests and unusual setups); ``visible`` then applies this server's CUDA_VISIBLE_DEVICES with
CUDA's own rules. Device N of the result is what ``gpus = [N]`` in an instance group means,
and an instance on it gets the device's UUID as its CUDA_VISIBLE_DEVICES, so the process
sees exactly that device, as ``cuda:0``.
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Sequence

import msgspec

from reposerve.repository import nvml
from reposerve.repository.nvml import Gpu, ProcessMemory

log = logging.getLogger("reposerve.repository")

PROBE_VARIABLE = "REPOSERVE_GPU_PROBE"
PROBE_TIMEOUT_S = 30.0  # NVML waking 8 GPUs without persistence mode takes seconds
_PROBE_OUTPUT = msgspec.json.Decoder(list[Gpu])
_PROCESSES_OUTPUT = msgspec.json.Decoder(list[ProcessMemory])


class Device(msgspec.Struct, frozen=True):
    """A device CUDA shows this server: a whole GPU, or one MIG device of a GPU."""

    uuid: str  # GPU-... or MIG-...
    name: str
    memory: int  # bytes
    gpu: int  # NVML's index of the GPU it is, or is part of


class Gpus(msgspec.Struct, frozen=True):
    """What the probe found, what CUDA_VISIBLE_DEVICES said, and what that leaves visible."""

    found: tuple[Gpu, ...]
    setting: str | None  # CUDA_VISIBLE_DEVICES; None = unset
    visible: tuple[Device, ...]  # this server's CUDA devices 0, 1, ...

    def describe(self) -> str:
        """For errors: the devices seen, and why (the probe, CUDA_VISIBLE_DEVICES)."""
        if self.visible:
            listed = ", ".join(
                f"{index} = {device.uuid} ({device.name})"
                for index, device in enumerate(self.visible)
            )
            seen = f"this server sees {len(self.visible)}: {listed}"
        else:
            seen = "this server sees no GPU"
        setting = "unset" if self.setting is None else repr(self.setting)
        return f"{seen}; the node has {len(self.found)}; CUDA_VISIBLE_DEVICES is {setting}"


class _Invalid(Exception):
    """A CUDA_VISIBLE_DEVICES entry CUDA would stop at; the message says why."""


def visible(gpus: Sequence[Gpu], setting: str | None) -> list[Device]:
    """The devices CUDA shows a process whose CUDA_VISIBLE_DEVICES is ``setting``, in order.

    CUDA's rules: unset = every GPU; empty = none; otherwise comma-separated entries, each
    an index (NVML's numbering: PCI bus order, as nvidia-smi shows), ``GPU-<uuid>`` or
    ``MIG-<uuid>``, where a UUID may be cut to any prefix that names one device. The first
    entry that names no device, several devices, or one already listed ends the list: CUDA
    sees only the devices before it (logged as a warning naming the entry). A GPU in MIG
    mode stands for its MIG devices, since CUDA cannot run on the GPU itself then.
    """
    if setting is None:
        return [device for gpu in gpus for device in _devices(gpu)]
    found: list[Device] = []
    if not setting.strip():
        return found
    for entry in (part.strip() for part in setting.split(",")):
        try:
            devices = _lookup(gpus, entry)
            if any(device in found for device in devices):
                raise _Invalid("names a device listed before it")
        except _Invalid as why:
            log.warning(
                "CUDA_VISIBLE_DEVICES=%r: entry %r %s; CUDA stops there and sees only the "
                "%d device(s) before it",
                setting,
                entry,
                why,
                len(found),
            )
            break
        found += devices
    return found


def _lookup(gpus: Sequence[Gpu], entry: str) -> list[Device]:
    if entry.isdigit():  # "-1", "1.0" and the like name nothing, as in CUDA
        matches = [gpu for gpu in gpus if gpu.index == int(entry)]
        if not matches:
            raise _Invalid(f"is not a GPU index (the node has {len(gpus)} GPUs)")
        return _devices(matches[0])
    if entry.startswith("GPU-"):
        matches = [gpu for gpu in gpus if gpu.uuid.startswith(entry)]
        _one(entry, len(matches))
        return _devices(matches[0])
    if entry.startswith("MIG-"):
        migs = [(gpu, mig) for gpu in gpus for mig in gpu.mig_devices if mig.uuid.startswith(entry)]
        _one(entry, len(migs))
        gpu, mig = migs[0]
        return [Device(mig.uuid, mig.name, mig.memory, gpu.index)]
    raise _Invalid("is neither a GPU index nor a GPU-/MIG- UUID")


def _one(entry: str, matches: int) -> None:
    if matches == 0:
        raise _Invalid("matches no device")
    if matches > 1:
        raise _Invalid(f"is a prefix of {matches} devices' UUIDs")


def _devices(gpu: Gpu) -> list[Device]:
    if gpu.mig_enabled:
        return [Device(mig.uuid, mig.name, mig.memory, gpu.index) for mig in gpu.mig_devices]
    return [Device(gpu.uuid, gpu.name, gpu.memory, gpu.index)]


def probe(timeout: float = PROBE_TIMEOUT_S) -> list[Gpu]:
    """The node's GPUs from the probe process; [] when it fails or hangs (logged)."""
    return _run_probe([], _PROBE_OUTPUT, "list of GPUs", "no GPU will be used", timeout)


def process_memory(timeout: float = PROBE_TIMEOUT_S) -> dict[int, dict[int, int]]:
    """pid -> {NVML GPU index: bytes} for every process holding GPU memory, from the probe
    process; {} when it fails (logged): footprints then count host memory only."""
    found = _run_probe(
        ["processes"], _PROCESSES_OUTPUT, "list of processes", "GPU footprints read 0", timeout
    )
    held: dict[int, dict[int, int]] = {}
    for entry in found:
        on_gpus = held.setdefault(entry.pid, {})
        on_gpus[entry.gpu] = on_gpus.get(entry.gpu, 0) + entry.memory
    return held


def _run_probe(
    arguments: list[str], output: msgspec.json.Decoder, what: str, otherwise: str, timeout: float
) -> list:
    """The probe's decoded stdout (``what`` it lists), run with ``arguments``; [] when it
    fails (logged, with ``otherwise``: what that means)."""
    command = os.environ.get(PROBE_VARIABLE)
    argv = [*(shlex.split(command) if command else [sys.executable, "-I", nvml.__file__])]
    argv += arguments
    try:
        done = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        log.error("GPU probe %s gave no answer within %g s: %s", argv, timeout, otherwise)
        return []
    except OSError as exc:
        log.error("GPU probe %s could not start (%s): %s", argv, exc, otherwise)
        return []
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()
        log.error("GPU probe %s failed (exit %d): %s; %s", argv, done.returncode, why, otherwise)
        return []
    try:
        return output.decode(done.stdout)
    except msgspec.DecodeError as exc:
        log.error("GPU probe %s printed no %s (%s): %s", argv, what, exc, otherwise)
        return []


_discovery = threading.Lock()


def discover() -> Gpus:
    """This server's GPUs: the probe's list (run once per process) under its own
    CUDA_VISIBLE_DEVICES. The first call blocks while the probe runs: call it off the loop."""
    with _discovery:  # concurrent first loads wait for the one probe
        return _discover_once()


@functools.cache
def _discover_once() -> Gpus:
    found = probe()
    setting = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = Gpus(tuple(found), setting, tuple(visible(found, setting)))
    for index, device in enumerate(gpus.visible):
        log.info(
            "GPU %d: %s (%s, %.1f GiB)", index, device.uuid, device.name, device.memory / 2**30
        )
    return gpus
