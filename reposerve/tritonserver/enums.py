"""Triton's enums, with the numbers its C API gives them (``tritonserver.h``), so code that
compares or stores them sees the same values. Members reposerve has no use for are kept:
code written for Triton names them."""

from __future__ import annotations

import enum


class DataType(enum.IntEnum):
    """A tensor's element type; the names are the V2 datatypes."""

    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    BYTES = 13
    BF16 = 14


class MemoryType(enum.IntEnum):
    """Where a tensor's memory lies; reposerve's is always on the host (CPU)."""

    CPU = 0
    CPU_PINNED = 1
    GPU = 2


class DLDeviceType(enum.IntEnum):
    """DLPack's device types (``dlpack.h``), those Triton's memory types map to."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLCUDAManaged = 13


class ModelControlMode(enum.IntEnum):
    NONE = 0
    POLL = 1
    EXPLICIT = 2


class LogFormat(enum.IntEnum):
    DEFAULT = 0
    ISO8601 = 1


class RateLimitMode(enum.IntEnum):
    OFF = 0
    EXEC_COUNT = 1


class InstanceGroupKind(enum.IntEnum):
    AUTO = 0
    CPU = 1
    GPU = 2
    MODEL = 3


class MetricFormat(enum.IntEnum):
    PROMETHEUS = 0


class ModelBatchFlag(enum.IntFlag):
    UNKNOWN = 1
    FIRST_DIM = 2


class ModelTxnPropertyFlag(enum.IntFlag):
    ONE_TO_ONE = 1
    DECOUPLED = 2
