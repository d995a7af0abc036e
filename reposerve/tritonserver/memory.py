"""Where a tensor's memory lies: ``MemoryBuffer`` (a pointer, its size, and the object
that owns the memory, which the buffer keeps alive), and the one reading of the ways
Triton's API names a device (``"cpu"``, ``"gpu:1"``, ``MemoryType.CPU``, a
``(DLDeviceType, id)`` pair). reposerve runs on host memory only: a device on a GPU is
refused here with ``UnsupportedError``, never copied to behind the caller's back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from reposerve.tritonserver.enums import DLDeviceType, MemoryType
from reposerve.tritonserver.errors import InvalidArgumentError, UnsupportedError

DeviceOrMemoryType = tuple[MemoryType, int] | MemoryType | tuple[DLDeviceType, int] | str

_NAMED = {"cpu": MemoryType.CPU, "gpu": MemoryType.GPU, "cuda": MemoryType.GPU}
_OF_DLPACK = {
    DLDeviceType.kDLCPU: MemoryType.CPU,
    DLDeviceType.kDLCUDAHost: MemoryType.CPU_PINNED,
    DLDeviceType.kDLCUDA: MemoryType.GPU,
    DLDeviceType.kDLCUDAManaged: MemoryType.GPU,
}
_EXPECTED = "'cpu', 'gpu', 'cpu:N', a MemoryType, or a (MemoryType or DLDeviceType, id) pair"
NO_GPU = (
    "GPU memory is not supported by reposerve's in-process API (its tensors are on the "
    "host): copy the data to the host first (numpy, .cpu(), cupy.asnumpy)"
)


@dataclass
class MemoryBuffer:
    """``size`` bytes at ``data_ptr``, in memory that ``owner`` holds."""

    data_ptr: int
    memory_type: MemoryType
    memory_type_id: int
    size: int
    owner: Any

    @staticmethod
    def from_dlpack(owner: Any) -> MemoryBuffer:
        """The memory of a host object that DLPack (or numpy) can read."""
        array = owner if isinstance(owner, np.ndarray) else host_array(owner)
        return MemoryBuffer.of_array(array, owner)

    @staticmethod
    def of_array(array: np.ndarray, owner: Any) -> MemoryBuffer:
        """``array``'s memory, which ``owner`` holds. The address is read from its array
        interface: ``ndarray.ctypes`` leaves memory behind for each array it is read on,
        which Triton's leak test counts."""
        address = array.__array_interface__["data"][0]
        return MemoryBuffer(address, MemoryType.CPU, 0, array.nbytes, owner)


def host_array(obj: Any) -> np.ndarray:
    """A numpy view of a DLPack object's memory; UnsupportedError for one on a GPU."""
    if hasattr(obj, "__dlpack_device__"):
        device, _ = obj.__dlpack_device__()
        if _OF_DLPACK.get(device) == MemoryType.GPU:
            raise UnsupportedError(f"{type(obj).__name__} on DLPack device {device}: {NO_GPU}")
    return np.from_dlpack(obj)


def memory_type_of(device: DeviceOrMemoryType) -> tuple[MemoryType, int]:
    """A device as Triton's API may name it, as (memory type, id); InvalidArgumentError
    for what names none."""
    match device:
        case str():
            name, _, index = device.lower().partition(":")
            if name in _NAMED and (index.isdigit() or not index):
                return _NAMED[name], int(index or 0)
        case MemoryType():
            return device, 0
        case (MemoryType() as kind, int(index)):
            return kind, index
        case (DLDeviceType() as kind, int(index)) if kind in _OF_DLPACK:
            return _OF_DLPACK[kind], index
    raise InvalidArgumentError(f"memory type {device!r}: expected {_EXPECTED}")


def on_host(device: DeviceOrMemoryType, what: str) -> None:
    """Refuse ``device`` (``what`` names where it was given) unless it is host memory."""
    memory_type, _ = memory_type_of(device)
    if memory_type == MemoryType.GPU:
        raise UnsupportedError(f"{what} {device!r}: {NO_GPU}")
