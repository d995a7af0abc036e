"""The GPU probe: the node's GPUs and MIG devices as NVML lists them, printed as JSON.

The front never loads CUDA: a CUDA context would pin memory on every GPU and a broken
driver could hang the server. It runs this file as a short process instead (by path, with
``python -I``, so that nothing but ctypes and msgspec is imported) and reads one JSON list
of ``Gpu`` from its stdout. No NVML library, or no driver loaded, prints ``[]``; any other
NVML error goes to stderr with exit status 1. With the argument ``processes`` it lists the
GPU memory each process holds instead (``ProcessMemory``), for the memory budgets.
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


class ProcessMemory(msgspec.Struct, frozen=True):
    gpu: int  # NVML's index of the GPU
    pid: int  # as the driver sees it: in a container, the host's pid unless NVML maps it
    memory: int  # bytes


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


class _ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_v2_t, what the _v2 process query writes (and _v3 on most drivers)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


_INSUFFICIENT_SIZE = 7
_FUNCTION_NOT_FOUND = 13
_PROCESS_QUERIES = (
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
)
_VALUE_NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory under some drivers (Windows, MIG)


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

    def processes(self, handle: ctypes.c_void_p) -> list[tuple[int, int]]:
        """(pid, bytes) of each compute process on the GPU ``handle``. The _v2 query first:
        its entries are nvmlProcessInfo_v2_t on every driver, where early R535 drivers
        write larger entries from _v3 than the header they shipped declares."""
        query = next((name for name in _PROCESS_QUERIES if hasattr(self._lib, name)), None)
        if query is None:
            raise NvmlError(_PROCESS_QUERIES[0], _FUNCTION_NOT_FOUND, "not in this driver")
        count = ctypes.c_uint(0)
        for _ in range(8):  # processes may start between asking how many and reading them
            infos = (_ProcessInfo * max(count.value, 1))()
            try:
                self.call(query, handle, ctypes.byref(count), infos)
            except NvmlError as exc:
                if exc.code == _INSUFFICIENT_SIZE:  # count now holds what it needs
                    count = ctypes.c_uint(count.value + 4)
                    continue
                raise
            return [
                (info.pid, 0 if info.usedGpuMemory == _VALUE_NOT_AVAILABLE else info.usedGpuMemory)
                for info in infos[: count.value]
            ]
        raise NvmlError(query, _INSUFFICIENT_SIZE, "the process list kept growing")


def _open() -> tuple[ctypes.CDLL, _Nvml] | None:
    """NVML initialised, or None without its library or a driver."""
    try:
        library = ctypes.CDLL(_LIBRARY)
    except OSError:
        return None
    nvml = _Nvml(library)
    try:
        nvml.call("nvmlInit_v2")
    except NvmlError as exc:
        if exc.code == _DRIVER_NOT_LOADED:
            return None
        raise
    return library, nvml


def _handles(nvml: _Nvml) -> list[ctypes.c_void_p]:
    count = ctypes.c_uint()
    nvml.call("nvmlDeviceGetCount_v2", ctypes.byref(count))
    handles = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        nvml.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        handles.append(handle)
    return handles


def process_memory() -> list[ProcessMemory]:
    """The GPU memory of every compute process, per GPU; [] without NVML or a driver."""
    opened = _open()
    if opened is None:
        return []
    library, nvml = opened
    try:
        return [
            ProcessMemory(gpu=index, pid=pid, memory=memory)
            for index, handle in enumerate(_handles(nvml))
            for pid, memory in nvml.processes(handle)
        ]
    finally:
        library.nvmlShutdown()


def probe() -> list[Gpu]:
    """Every GPU this process may use, with its MIG devices; [] without NVML or a driver."""
    opened = _open()
    if opened is None:
        return []
    library, nvml = opened
    try:
        gpus = []
        for index, handle in enumerate(_handles(nvml)):
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
        found = process_memory() if sys.argv[1:] == ["processes"] else probe()
    except NvmlError as exc:
        sys.exit(f"GPU probe: {exc}")
    sys.stdout.buffer.write(msgspec.json.encode(found))
