"""Triton's ``triton_python_backend_utils``, as a ``TritonPythonModel`` imports it.

Written from Triton's python-backend documentation (no code of Triton's): the part of the
module models commonly use — ``Tensor``, ``InferenceRequest``, ``InferenceResponse``,
``TritonError``, ``TritonModelException``, ``Logger``, the ``get_*_by_name`` helpers and
the datatype conversions. ``reposerve.backends.python`` registers it in ``sys.modules``
under Triton's name before a model file runs, so ``import triton_python_backend_utils as
pb_utils`` works unchanged; ``reposerve.backends.triton_python`` drives the model.

Tensors hold numpy arrays on the CPU. An input tensor's array is a slice of reposerve's
batch in shared memory, valid only until ``execute`` returns (as in Triton: copy what you
keep). BYTES tensors are numpy object arrays of ``bytes``.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers through each
request's ``get_response_sender()``: ``send(response, flags)`` any number of times, from
``execute`` or from threads it starts, ending with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``;
``is_cancelled()`` turns true once the client has gone.

Business logic scripting: ``pb_utils.InferenceRequest(model_name=..., inputs=[...],
requested_output_names=[...]).exec()`` (or ``await ... .async_exec()``) calls a model of
the repository through reposerve's model calls and gives its ``InferenceResponse``.

Not provided, each failing with a message that says so: decoupled BLS calls, GPU tensors
through DLPack, custom metrics, ``auto_complete_config``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reposerve.errors import ReposerveError

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
_TYPE_NUMBERS = {np.dtype(numpy_type): number for number, numpy_type in _TRITON_TYPES.items()}

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


class TritonModelException(Exception):
    """Raise it from ``execute`` to fail every request of the call with its message."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class TritonError:
    """The error of one response: that request fails, the others of the batch do not.

    The code decides the status the client sees, as in Triton: INTERNAL (the default)
    500, NOT_FOUND 404, UNAVAILABLE 503, and the client's-fault codes 400.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


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
    """A named numpy array: an input of a request or an output of a response."""

    def __init__(self, name: str, numpy_array: Any) -> None:
        array = np.asarray(numpy_array)
        if array.dtype.kind in "UV":
            raise TritonModelException(
                f"Tensor '{name}': dtype {array.dtype} is not supported. Hint: use "
                "np.object_ arrays of bytes for BYTES tensors"
            )
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> object:
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor over a DLPack source: an object with ``__dlpack__`` or a capsule."""
        source = capsule if hasattr(capsule, "__dlpack__") else _Capsule(capsule)
        try:
            array = np.from_dlpack(source)
        except (RuntimeError, BufferError, TypeError) as exc:
            raise TritonModelException(
                f"Tensor.from_dlpack('{name}'): {exc}. Hint: reposerve's python models take "
                "CPU tensors; move the tensor to the CPU first"
            ) from None
        return Tensor(name, array)


TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # a sender's flag: the request's last response


class InferenceResponseSender:
    """How a decoupled model answers one request: ``deliver(response, final)`` takes each
    response to reposerve (it may block while the client is slow to read)."""

    def __init__(
        self,
        deliver: Callable[[InferenceResponse | None, bool], None],
        cancelled: Callable[[], bool],
    ) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}"
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self._closed = final
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return self._cancelled()


class InferenceRequest:
    """One client request of the batch, as ``execute`` receives it; or, built by the model
    with ``model_name`` (Triton's BLS), a call to another model: ``exec()`` /
    ``await async_exec()`` give its ``InferenceResponse`` (an error one if it failed)."""

    def __init__(
        self,
        inputs: list[Tensor] | None = None,
        request_id: str = "",
        requested_output_names: list[str] | None = None,
        sender: InferenceResponseSender | None = None,
        *,
        model_name: str = "",
        model_version: int = -1,
        **options: object,
    ) -> None:
        # Triton's other BLS options: at their defaults they ask nothing reposerve lacks.
        refused = [key for key, value in options.items() if value not in (None, 0, "", {})]
        if refused:
            raise TritonModelException(
                f"InferenceRequest: {', '.join(sorted(refused))} not supported by reposerve"
            )
        self._inputs = list(inputs or ())
        self._request_id = request_id
        self._requested_output_names = list(requested_output_names or ())
        self._sender = sender  # a decoupled model's
        self._model_name = model_name
        self._model_version = model_version

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        """The id the client gave the request, or "" when it gave none."""
        return self._request_id

    def requested_output_names(self) -> list[str]:
        """Every output the model declares: as Triton does for a request that names none,
        and reposerve sends each client only what it asked for."""
        return self._requested_output_names

    def correlation_id(self) -> int:
        return 0  # no sequence batching in reposerve

    def flags(self) -> int:
        return 0

    def is_cancelled(self) -> bool:
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() is for decoupled models. Hint: set "
                "model_transaction_policy { decoupled: true } in config.pbtxt (decoupled = true "
                "in config.toml), or return one pb_utils.InferenceResponse per request"
            )
        return self._sender

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Run this request on ``model_name`` (Triton's BLS), blocking until it answers."""
        caller = self._bls_caller(decoupled)
        try:
            outputs = caller.infer_sync(self._model_name, self._arrays(), self._version())
        except ReposerveError as exc:
            return InferenceResponse(error=TritonError(exc.message))
        return self._response(outputs)

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse:
        caller = self._bls_caller(decoupled)
        try:
            outputs = await caller.infer(self._model_name, self._arrays(), self._version())
        except ReposerveError as exc:
            return InferenceResponse(error=TritonError(exc.message))
        return self._response(outputs)

    def _bls_caller(self, decoupled: bool) -> Any:
        if not self._model_name:
            raise TritonModelException("exec() needs a request built with model_name=...")
        if decoupled:
            raise TritonModelException("exec(decoupled=True) is not supported by reposerve")
        if _caller is None:
            raise TritonModelException("no repository to call models in")
        return _caller

    def _arrays(self) -> dict[str, np.ndarray]:
        return {tensor.name(): tensor.as_numpy() for tensor in self._inputs}

    def _version(self) -> int | None:
        return None if self._model_version < 0 else self._model_version

    def _response(self, outputs: dict[str, np.ndarray]) -> InferenceResponse:
        wanted = self._requested_output_names or list(outputs)
        missing = [name for name in wanted if name not in outputs]
        if missing:
            return InferenceResponse(
                error=TritonError(
                    f"model '{self._model_name}' has no output {', '.join(missing)} "
                    f"(it has: {', '.join(outputs)})"
                )
            )
        return InferenceResponse([Tensor(name, outputs[name]) for name in wanted])


class InferenceResponse:
    """The answer to one request: its output tensors, or an error that fails only it."""

    def __init__(
        self, output_tensors: Sequence[Tensor] | None = None, error: TritonError | None = None
    ) -> None:
        self._output_tensors = list(output_tensors or ())
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    """Whether the model config (``json.loads`` of ``args["model_config"]``) is decoupled."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    """The ``input`` entry named ``name`` of the model config (``json.loads`` of
    ``args["model_config"]``), or None."""
    return next((entry for entry in model_config.get("input", ()) if entry["name"] == name), None)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((entry for entry in model_config.get("output", ()) if entry["name"] == name), None)


_log = logging.getLogger("reposerve.model")
_caller: Any = None  # the instance's ModelCaller, for BLS requests (set by the shim)


class Logger:
    """Log lines from the model, on the instance's stderr (which is the server's).
    VERBOSE lines are kept back, as Triton does unless its --log-verbose is set."""

    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG

    @staticmethod
    def log(message: str, level: int = logging.INFO) -> None:
        _log.log(level, message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info(message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning(message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error(message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug(message)


def _start_logging(model_name: str) -> None:
    """Give the model's log lines the front's text format and its name; called once by
    the shim before ``initialize`` (the instance process configures no logging itself)."""
    global _log
    _log = logging.getLogger(f"reposerve.model.{model_name}")
    if not _log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)
        _log.propagate = False
