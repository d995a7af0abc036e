"""The GPU probe: the node's GPUs and MIG devices as NVML lists them, printed as JSON.

The front never loads CUDA: a CUDA context would pin memory on every GPU and a broken
driver could hang the server. It runs this file as a short process instead (by path, with
``python -I``, so that nothing but ctypes and msgspec is imported) and reads one JSON list
of ``Gpu`` from its stdout. No NVML library, or no driver loaded, prints ``[]``; any other
NVML error goes to stderr with exit status 1.
"""

from __future__ import annotations

import ctypes
import sys

import msgspec

_LIBRARY = "libnvidia-ml.so.1"
_BUFFER_SIZE = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE and NVML_DEVICE_NAME_V2_BUFFER_SIZE
_SUCCESS = 0
_NOT_SUPPORTED = 3  # MIG queries on a GPU without MIG
_NOT_FOUND = 6  # a MIG slot with no MIG device in it
_DRIVER_NOT_LOADED = 9
_MIG_ENABLED = 1


class MigDevice(msgspec.Struct, frozen=True):
    uuid: str  # MIG-...
    name: str
    memory: int  # bytes


class Gpu(msgspec.Struct, frozen=True):
    index: int  # NVML's index (PCI bus order, nvidia-smi's numbering)
    uuid: str  # GPU-...
    name: str
    memory: int  # bytes
    mig_enabled: bool = False
    mig_devices: list[MigDevice] = []  # in MIG mode CUDA runs on these, never on the GPU itself


class NvmlError(Exception):
    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call} failed: {text} (NVML error {code})")
        self.code = code


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _Nvml:
    """The few NVML calls the probe makes, each checked."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        self._lib.nvmlErrorString.restype = ctypes.c_char_p

    def call(self, name: str, *args: object) -> None:
        """Run the NVML function ``name``; raise NvmlError unless it succeeds."""
        code = getattr(self._lib, name)(*args)
        if code != _SUCCESS:
            text = self._lib.nvmlErrorString(code).decode(errors="replace")
            raise NvmlError(name, code, text)

    def text(self, name: str, handle: ctypes.c_void_p) -> str:
        buffer = ctypes.create_string_buffer(_BUFFER_SIZE)
        self.call(name, handle, buffer, ctypes.c_uint(_BUFFER_SIZE))
        return buffer.value.decode(errors="replace")

    def memory(self, handle: ctypes.c_void_p) -> int:
        memory = _Memory()
        self.call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
        return int(memory.total)

    def mig_enabled(self, handle: ctypes.c_void_p) -> bool:
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        try:
            self.call("nvmlDeviceGetMigMode", handle, ctypes.byref(current), ctypes.byref(pending))
        except NvmlError as exc:
            if exc.code == _NOT_SUPPORTED:
                return False
            raise
        return current.value == _MIG_ENABLED  # a pending change waits for a GPU reset

    def mig_devices(self, handle: ctypes.c_void_p) -> list[MigDevice]:
        slots = ctypes.c_uint()
        self.call("nvmlDeviceGetMaxMigDeviceCount", handle, ctypes.byref(slots))
        devices = []
        for index in range(slots.value):
            mig = ctypes.c_void_p()
            try:
                self.call(
                    "nvmlDeviceGetMigDeviceHandleByIndex",
                    handle,
                    ctypes.c_uint(index),
                    ctypes.byref(mig),
                )
            except NvmlError as exc:
                if exc.code == _NOT_FOUND:  # slots need not be filled in order
                    continue
                raise
            devices.append(
                MigDevice(
                    uuid=self.text("nvmlDeviceGetUUID", mig),
                    name=self.text("nvmlDeviceGetName", mig),
                    memory=self.memory(mig),
                )
            )
        return devices


def probe() -> list[Gpu]:
    """Every GPU this process may use, with its MIG devices; [] without NVML or a driver."""
    try:
        library = ctypes.CDLL(_LIBRARY)
    except OSError:
        return []
    nvml = _Nvml(library)
    try:
        nvml.call("nvmlInit_v2")
    except NvmlError as exc:
        if exc.code == _DRIVER_NOT_LOADED:
            return []
        raise
    try:
        count = ctypes.c_uint()
        nvml.call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            nvml.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
            mig_enabled = nvml.mig_enabled(handle)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=nvml.text("nvmlDeviceGetUUID", handle),
                    name=nvml.text("nvmlDeviceGetName", handle),
                    memory=nvml.memory(handle),
                    mig_enabled=mig_enabled,
                    mig_devices=nvml.mig_devices(handle) if mig_enabled else [],
                )
            )
        return gpus
    finally:
        library.nvmlShutdown()


if __name__ == "__main__":
    try:
        found = probe()
    except NvmlError as exc:
        sys.exit(f"GPU probe: {exc}")
    sys.stdout.buffer.write(msgspec.json.encode(found))
