"""What an exception from ``execute`` says about the process that raised it.

Most failures belong to the batch: the next one may well succeed. Two kinds of device
error do not fit that rule. Out of device memory is the batch's (too large, or unlucky
with fragmentation): cached blocks are handed back and the instance carries on. Any other
CUDA error (a device-side assert, an illegal memory access, a launch failure) poisons the
CUDA context for the life of the process, so every later batch would fail too, and fast,
which would draw ever more traffic to the broken instance: it ends after answering, and
its replacement takes over.

Frameworks report both as plain exceptions with the CUDA runtime's words in them (torch's
``AcceleratorError``/``OutOfMemoryError``, onnxruntime's ``Fail``), so they are told apart
by type name and message, following ``__cause__``/``__context__`` to the original.
"""

from __future__ import annotations

import enum
import sys

_OOM_TYPES = frozenset({"OutOfMemoryError"})
_OOM_WORDS = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED")
_FATAL_TYPES = frozenset({"AcceleratorError"})
_FATAL_WORDS = (
    "CUDA error",
    "CUDA failure",
    "CUDA driver error",
    "CUBLAS_STATUS_",
    "CUDNN_STATUS_",
    "cuDNN error",
    "device-side assert",
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
)


class Aftermath(enum.Enum):
    BATCH = "batch"  # the batch failed; the instance is as good as before
    OUT_OF_MEMORY = "out_of_memory"  # free the device's cached memory, then carry on
    POISONED = "poisoned"  # the device context is unusable: end the instance


def aftermath(exc: BaseException) -> Aftermath:
    """How an exception from execute leaves the instance that raised it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        text = str(current)
        if name in _OOM_TYPES or any(word in text for word in _OOM_WORDS):
            return Aftermath.OUT_OF_MEMORY
        if name in _FATAL_TYPES or any(word in text for word in _FATAL_WORDS):
            return Aftermath.POISONED
        current = current.__cause__ or current.__context__
    return Aftermath.BATCH


def free_device_memory() -> None:
    """Hand cached device memory back after an out-of-memory error, so the next batch
    starts from a clean pool. Only a framework this process already loaded is asked."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
