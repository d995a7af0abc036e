"""``pb_utils.Tensor`` and Triton's datatype conversions, as a TritonPythonModel uses them.

Written from Triton's python-backend documentation (no code of Triton's). A tensor holds a
numpy array on the CPU; a BF16 one holds its uint16 bit patterns and goes to and from torch
through DLPack.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from reposerve.backends.pb_errors import TritonModelException

# Triton's TRITONSERVER_DataType numbers, as numpy_to_triton_type / triton_to_numpy_type
# speak them. BF16 (14) has no numpy dtype: reposerve hands its bit patterns over as uint16.
_TRITON_TYPES: dict[int, type] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}
_TYPE_NUMBERS: dict[np.dtype, int] = {
    np.dtype(numpy_type): number for number, numpy_type in _TRITON_TYPES.items()
}
TYPE_BF16 = 14

TRITON_STRING_TO_NUMPY: dict[str, type] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def triton_string_to_numpy(triton_type_string: str) -> type:
    """The numpy type of a model-config ``data_type`` (``"TYPE_FP32"`` -> ``np.float32``)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type | None:
    return _TRITON_TYPES.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """Triton's datatype number for a numpy dtype (``np.bytes_`` counts as BYTES)."""
    dtype = np.dtype(data_type)
    if dtype.kind == "S":
        return 13
    return _TYPE_NUMBERS.get(dtype)


class _Capsule:
    """Lets numpy import a bare DLPack capsule (what ``torch.utils.dlpack.to_dlpack``
    returns): numpy only takes objects with ``__dlpack__``. CPU memory only."""

    def __init__(self, capsule: object) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: object, **kwargs: object) -> object:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


class Tensor:
    """A named numpy array: an input of a request or an output of a response.

    A BF16 tensor (numpy has no bfloat16) holds its uint16 bit patterns: ``as_numpy``
    refuses it, as Triton's does, and ``to_dlpack`` / ``from_dlpack`` carry it to and
    from torch as ``torch.bfloat16``.
    """

    def __init__(self, name: str, numpy_array: Any) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Tensor: name must be a non-empty str, got {name!r}")
        if numpy_array is None:
            raise TypeError(f"Tensor '{name}': expected a numpy array, got None")
        array = np.asarray(numpy_array)
        if array.dtype.kind in "UV":
            raise TritonModelException(
                f"Tensor '{name}': dtype {array.dtype} is not supported. Hint: use "
                "np.object_ arrays of bytes for BYTES tensors"
            )
        self._name = name
        self._array = array
        self._bf16 = False

    @classmethod
    def _of_bf16(cls, name: str, bits: np.ndarray) -> Tensor:
        """A BF16 tensor over its uint16 bit patterns."""
        tensor = cls(name, bits)
        tensor._bf16 = True
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._bf16:
            raise TritonModelException(
                f"Tensor '{self._name}': tensor dtype is BF16 and cannot be converted to "
                "numpy. Hint: use to_dlpack() and torch.utils.dlpack.from_dlpack"
            )
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        return TYPE_BF16 if self._bf16 else numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> object:
        if self._bf16:
            import torch  # only a model that uses BF16 through DLPack needs it

            bits = torch.from_numpy(np.ascontiguousarray(self._array).view(np.int16))
            return torch.utils.dlpack.to_dlpack(bits.view(torch.bfloat16))
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor over a DLPack source: an object with ``__dlpack__`` or a capsule."""
        if not isinstance(name, str) or not name:
            raise TritonModelException(
                f"Tensor.from_dlpack: name must be a non-empty str, got {name!r}"
            )
        if capsule is None:
            raise TritonModelException(
                f"Tensor.from_dlpack('{name}'): got None, not a DLPack tensor"
            )
        torch = sys.modules.get("torch")  # a model handing torch tensors over imported it
        try:
            if torch is not None:
                return _from_torch(name, torch, torch.utils.dlpack.from_dlpack(capsule))
            source = capsule if hasattr(capsule, "__dlpack__") else _Capsule(capsule)
            return Tensor(name, np.from_dlpack(source))
        except (RuntimeError, BufferError, TypeError) as exc:
            raise TritonModelException(
                f"Tensor.from_dlpack('{name}'): {exc}. Hint: reposerve's python models take "
                "CPU tensors; move the tensor to the CPU first"
            ) from None


def _from_torch(name: str, torch: Any, tensor: Any) -> Tensor:
    if tensor.device.type != "cpu":
        raise TypeError(f"the tensor is on {tensor.device}")
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return Tensor._of_bf16(name, tensor.view(torch.int16).numpy().view(np.uint16))
    return Tensor(name, tensor.numpy())
