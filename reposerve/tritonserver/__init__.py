"""Triton's in-process Python API (its ``tritonserver`` package) over reposerve, so code
written for it runs here by changing one import::

    import reposerve.tritonserver as tritonserver

    server = tritonserver.Server(model_repository="models").start(wait_until_ready=True)
    for response in server.model("add_sub").infer(inputs={"INPUT0": a, "INPUT1": b}):
        numpy.from_dlpack(response.outputs["OUTPUT0"])

The server under it is an embedded reposerve server (``reposerve.embedded``). Tensors are
in host memory: a GPU device or GPU memory is refused with ``UnsupportedError``.
"""

from reposerve.tritonserver.enums import (
    DataType,
    DLDeviceType,
    InstanceGroupKind,
    LogFormat,
    MemoryType,
    MetricFormat,
    ModelBatchFlag,
    ModelControlMode,
    ModelTxnPropertyFlag,
    RateLimitMode,
)
from reposerve.tritonserver.errors import (
    AlreadyExistsError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from reposerve.tritonserver.memory import MemoryBuffer
from reposerve.tritonserver.model import Model
from reposerve.tritonserver.options import Options, RateLimiterResource
from reposerve.tritonserver.request import InferenceRequest
from reposerve.tritonserver.response import InferenceResponse
from reposerve.tritonserver.server import Server
from reposerve.tritonserver.tensor import Tensor

__all__ = [
    "AlreadyExistsError",
    "DLDeviceType",
    "DataType",
    "InferenceRequest",
    "InferenceResponse",
    "InstanceGroupKind",
    "InternalError",
    "InvalidArgumentError",
    "LogFormat",
    "MemoryBuffer",
    "MemoryType",
    "MetricFormat",
    "Model",
    "ModelBatchFlag",
    "ModelControlMode",
    "ModelTxnPropertyFlag",
    "NotFoundError",
    "Options",
    "RateLimitMode",
    "RateLimiterResource",
    "Server",
    "Tensor",
    "TritonError",
    "UnavailableError",
    "UnknownError",
    "UnsupportedError",
]
