"""``Tensor``: a datatype, a shape and a ``MemoryBuffer``, as Triton's API has it, in
host memory. Any DLPack reader takes it without a copy (``numpy.from_dlpack(tensor)``,
``torch.from_dlpack``): the array it makes keeps the tensor, and so its memory, alive.
BYTES tensors hold their elements framed as the wire frames them (a 4-byte length, then
the bytes), and are read with ``to_bytes_array`` or ``to_string_array``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reposerve.datatypes import NUMPY_DTYPES, to_numpy, to_wire
from reposerve.embedded.tensors import RawTensor
from reposerve.tritonserver.enums import DataType, DLDeviceType, MemoryType
from reposerve.tritonserver.errors import InvalidArgumentError
from reposerve.tritonserver.memory import (
    DeviceOrMemoryType,
    MemoryBuffer,
    host_array,
    on_host,
)

# The dtype a fixed-size datatype's elements are read as (BF16: their uint16 bits), and
# the datatype of an array's dtype.
_DTYPES = {DataType[name]: dtype for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"}
_OF_DTYPE = {dtype: datatype for datatype, dtype in _DTYPES.items() if datatype != DataType.BF16}
_BYTE = np.dtype(np.uint8)
_TEXT_KINDS = "OSU"  # numpy kinds whose elements are BYTES: objects, bytes, str


class _HostView:
    """An array interface over a tensor's memory that holds the tensor, so the arrays
    numpy makes of it (and DLPack capsules of those) keep it alive."""

    def __init__(self, tensor: Tensor, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.tensor = tensor
        self.__array_interface__ = {
            "version": 3,
            "shape": shape,
            "typestr": dtype.str,
            "data": (tensor.data_ptr, _read_only(tensor.memory_buffer.owner)),
        }


def _read_only(owner: Any) -> bool:
    return isinstance(owner, np.ndarray) and not owner.flags.writeable


@dataclass
class Tensor:
    data_type: DataType
    shape: Sequence[int]
    memory_buffer: MemoryBuffer

    @property
    def data_ptr(self) -> int:
        return self.memory_buffer.data_ptr

    @property
    def memory_type(self) -> MemoryType:
        return self.memory_buffer.memory_type

    @property
    def memory_type_id(self) -> int:
        return self.memory_buffer.memory_type_id

    @property
    def size(self) -> int:
        """The size of its memory in bytes."""
        return self.memory_buffer.size

    # -- reading it ----------------------------------------------------------------------

    def __dlpack__(self, *, stream: Any = None, **options: Any) -> Any:
        """A DLPack capsule of its elements (host memory: ``stream`` has nothing to
        order, as DLPack says of a CPU tensor)."""
        return self._elements().__dlpack__(**options)

    def __dlpack_device__(self) -> tuple[DLDeviceType, int]:
        return DLDeviceType.kDLCPU, 0

    def to_bytes_array(self) -> np.ndarray:
        """A BYTES tensor's elements, as an array of bytes objects of its shape."""
        if self.data_type != DataType.BYTES:
            raise InvalidArgumentError(
                f"tensor has data type {self.data_type.name}, not BYTES: read it with "
                "numpy.from_dlpack"
            )
        raw = np.asarray(_HostView(self, _BYTE, (self.size,)))
        return to_numpy("BYTES", tuple(self.shape), raw.data)

    def to_string_array(self) -> np.ndarray:
        """A BYTES tensor's elements decoded as UTF-8 text, an array of str objects."""
        elements = self.to_bytes_array()
        text = np.empty(elements.shape, dtype=object)
        text.reshape(-1)[:] = [element.decode() for element in elements.reshape(-1)]
        return text

    def to_host(self) -> Tensor:
        return self  # its memory is the host's already

    def to_device(self, device: DeviceOrMemoryType) -> Tensor:
        """The tensor in ``device``'s memory: itself for the host; UnsupportedError for a
        GPU."""
        on_host(device, "device")
        return self

    def raw_tensor(self) -> RawTensor:
        """The tensor as a request's input carries it (its bytes are not copied)."""
        raw = np.asarray(_HostView(self, _BYTE, (self.size,))).data
        return RawTensor(self.data_type.name, list(self.shape), raw)

    def _elements(self) -> np.ndarray:
        if self.data_type == DataType.BYTES:
            raise InvalidArgumentError(
                "a BYTES tensor has no DLPack form: read it with to_bytes_array() or "
                "to_string_array()"
            )
        return np.asarray(_HostView(self, _DTYPES[self.data_type], tuple(self.shape)))

    # -- making one --------------------------------------------------------------------------

    @staticmethod
    def from_dlpack(obj: Any) -> Tensor:
        """A tensor over the memory of a host object DLPack reads (a numpy array, a CPU
        torch tensor), without a copy; the tensor keeps ``obj`` alive."""
        array = obj if isinstance(obj, np.ndarray) else host_array(obj)
        if not (array.flags.c_contiguous and array.dtype.isnative):
            array = obj = np.ascontiguousarray(array, array.dtype.newbyteorder("="))
        data_type = _OF_DTYPE.get(array.dtype)
        if data_type is None:
            raise InvalidArgumentError(
                f"dtype {array.dtype} has no Triton data type"
                + (": use Tensor.from_bytes_array" if array.dtype.kind in _TEXT_KINDS else "")
            )
        return Tensor(data_type, list(array.shape), MemoryBuffer.of_array(array, obj))

    @staticmethod
    def from_bytes_array(array: Sequence[Any] | np.ndarray) -> Tensor:
        """A BYTES tensor of ``array``'s elements (bytes, or str, sent as UTF-8)."""
        elements = np.asarray(array, dtype=object)
        try:
            framed = to_wire("BYTES", elements)
        except TypeError as exc:
            raise InvalidArgumentError(str(exc)) from None
        owner = np.frombuffer(framed, dtype=_BYTE)
        memory = MemoryBuffer.of_array(owner, owner)
        return Tensor(DataType.BYTES, list(elements.shape), memory)

    @staticmethod
    def from_string_array(array: Sequence[Any] | np.ndarray) -> Tensor:
        """A BYTES tensor of ``array``'s str elements, encoded as UTF-8."""
        elements = np.asarray(array, dtype=object)
        strange = [
            type(item).__name__ for item in elements.reshape(-1) if not isinstance(item, str)
        ]
        if strange:
            raise InvalidArgumentError(
                f"from_string_array takes str elements, got {strange[0]}: use from_bytes_array"
            )
        return Tensor.from_bytes_array(elements)

    @staticmethod
    def from_object(value: Any) -> Tensor:
        """A request's input as Triton's API takes it: a Tensor, a list, a numpy array
        (str, bytes and object arrays as BYTES), or anything DLPack reads."""
        if isinstance(value, Tensor):
            return value
        if isinstance(value, list | tuple):
            value = np.array(value)
        if isinstance(value, np.ndarray | np.generic):
            array = np.asarray(value)
            if array.dtype.kind in _TEXT_KINDS:
                return Tensor.from_bytes_array(array)
            return Tensor.from_dlpack(array)
        if hasattr(value, "__dlpack__"):
            return Tensor.from_dlpack(value)
        raise InvalidArgumentError(
            f"input of type {type(value).__name__}: expected a Tensor, a list, a numpy "
            "array or an object with __dlpack__"
        )
