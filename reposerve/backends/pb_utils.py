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

Every argument is checked as Triton checks it: a wrong type raises ``TypeError``, a list
holding something other than a ``Tensor`` raises ``TritonModelException``.

Not provided, each failing with a message that says so: decoupled BLS calls and BLS
options reposerve cannot honour (``timeout``, flags, a preferred memory), GPU tensors
through DLPack.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

# pb_utils.ModelConfig (what auto_complete_config edits), the custom metrics' classes, the
# errors and the tensors, under pb_utils' names.
from reposerve.backends.pb_config import ModelConfig as ModelConfig
from reposerve.backends.pb_errors import TritonError as TritonError
from reposerve.backends.pb_errors import TritonModelException as TritonModelException
from reposerve.backends.pb_logging import Logger as Logger
from reposerve.backends.pb_logging import LogLevel as LogLevel
from reposerve.backends.pb_logging import connect_logs as connect_logs
from reposerve.backends.pb_metrics import Metric as Metric
from reposerve.backends.pb_metrics import MetricFamily as MetricFamily
from reposerve.backends.pb_tensor import TRITON_STRING_TO_NUMPY as TRITON_STRING_TO_NUMPY
from reposerve.backends.pb_tensor import TYPE_BF16 as TYPE_BF16
from reposerve.backends.pb_tensor import Tensor as Tensor
from reposerve.backends.pb_tensor import numpy_to_triton_type as numpy_to_triton_type
from reposerve.backends.pb_tensor import triton_string_to_numpy as triton_string_to_numpy
from reposerve.backends.pb_tensor import triton_to_numpy_type as triton_to_numpy_type
from reposerve.errors import ErrorKind, ReposerveError

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # a sender's flag: the request's last response
# request.flags(): the request starts or ends its sequence (sequence batching)
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
# request.set_release_flags(): done with the request, or run it again later (rescheduling)
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class InferenceResponseSender:
    """How a model answers one request through ``request.get_response_sender()``:
    ``deliver(response, final)`` takes each response to reposerve (it may block while the
    client is slow to read). A decoupled model sends any number; any other model one,
    with the FINAL flag then or in a flag-only send after it."""

    def __init__(
        self,
        deliver: Callable[[InferenceResponse | None, bool], None],
        cancelled: Callable[[], bool],
        decoupled: bool = True,
    ) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._decoupled = decoupled
        self._sent = 0
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
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
        if not self._decoupled:
            if response is not None and self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response."
                )
            if response is None and final and not self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response."
                )
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        self._closed = final
        self._sent += 1
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return self._cancelled()


def _check_list(where: str, value: object, item_type: type, exception: type) -> list:
    """Triton's checks of a list argument: not a list is a TypeError; an element of the
    wrong type is ``exception`` (TypeError for names, TritonModelException for tensors)."""
    if not isinstance(value, list | tuple):
        raise TypeError(f"{where}: expected a list, got {type(value)}")
    for element in value:
        if not isinstance(element, item_type):
            raise exception(f"{where}: expected {item_type.__name__} elements, got {type(element)}")
    return list(value)


def _check_type(where: str, value: object, types: type | tuple[type, ...]) -> None:
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise TypeError(f"{where}: incompatible type {type(value)}")


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _parameters_text(parameters: object, where: str) -> str:
    """Request or response parameters as Triton keeps them: a JSON object's text, keys
    str, values bool, int or str (a JSON text is taken as it is, once checked)."""
    if isinstance(parameters, str):
        try:
            parameters = msgspec.json.decode(parameters) if parameters else {}
        except msgspec.DecodeError as exc:
            raise TritonModelException(f"{where}: parameters are not JSON: {exc}") from None
    if not isinstance(parameters, dict):
        raise TritonModelException(
            f"{where}: parameters must be a dict of str to bool/int/str, got {type(parameters)}"
        )
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return msgspec.json.encode(parameters).decode()


class PreferredMemory:
    """Where a BLS call's outputs should live; reposerve's live in CPU memory."""

    def __init__(self, preferred_memory_type: int = 0, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2


class InferenceTrace:
    """A request's trace context; reposerve traces nothing, so it carries nothing."""

    def __init__(self, context: str | None = None) -> None:
        self._context = context

    def get_context(self) -> str | None:
        return self._context


class InferenceRequest:
    """One client request of the batch, as ``execute`` receives it; or, built by the model
    with ``model_name`` (Triton's BLS), a call to another model: ``exec()`` /
    ``await async_exec()`` give its ``InferenceResponse`` (an error one if it failed)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str | bytes | None = None,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict | str | None = None,
    ) -> None:
        where = "InferenceRequest"
        self._inputs = _check_list(f"{where}: inputs", inputs, Tensor, TritonModelException)
        self._requested_output_names = _check_list(
            f"{where}: requested_output_names", requested_output_names, str, TypeError
        )
        if isinstance(model_name, bytes):  # as a BYTES input holds it
            model_name = model_name.decode("utf-8", "replace")
        if not isinstance(model_name, str):  # _check_type's words, the type narrowed
            raise TypeError(f"{where}: model_name: incompatible type {type(model_name)}")
        _check_type(f"{where}: request_id", request_id, str)
        _check_type(f"{where}: correlation_id", correlation_id, (int, str))
        _check_type(f"{where}: model_version", model_version, int)
        _check_type(f"{where}: flags", flags, int)
        _check_type(f"{where}: timeout", timeout, int)
        if preferred_memory is not None and not isinstance(preferred_memory, PreferredMemory):
            raise TypeError(
                f"{where}: preferred_memory: incompatible type {type(preferred_memory)}"
            )
        self._model_name = model_name
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory
        self._trace = trace or InferenceTrace()
        self._parameters = "{}" if parameters is None else _parameters_text(parameters, where)
        self._sender: InferenceResponseSender | None = None  # a received request's
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._cancelled: Callable[[], bool] = _never

    @classmethod
    def _received(
        cls,
        inputs: list[Tensor],
        request_id: str,
        requested_output_names: list[str],
        parameters: str,
        sender: InferenceResponseSender,
        cancelled: Callable[[], bool],
        timeout: int = 0,
        correlation_id: int | str = 0,
        flags: int = 0,
    ) -> InferenceRequest:
        """A client's request, as ``execute`` gets it (``parameters`` already checked)."""
        request = cls.__new__(cls)
        request._inputs = inputs
        request._request_id = request_id
        request._requested_output_names = requested_output_names
        request._parameters = parameters
        request._correlation_id = correlation_id
        request._model_name = ""
        request._model_version = -1
        request._flags = flags
        request._timeout = timeout
        request._preferred_memory = None
        request._trace = InferenceTrace()
        request._sender = sender
        request._cancelled = cancelled
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        """The id the client gave the request, or "" when it gave none."""
        return self._request_id

    def requested_output_names(self) -> list[str]:
        """The outputs the client asked for (every declared one when it named none)."""
        return self._requested_output_names

    def parameters(self) -> str:
        """The request's parameters, a JSON object's text (Triton's form)."""
        return self._parameters

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def trace(self) -> InferenceTrace:
        return self._trace

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def set_release_flags(self, flags: int) -> None:
        """RESCHEDULE: run this request through execute again once this one returns
        (an iterative model's next step); ALL (the default): done with it."""
        _check_type("set_release_flags: flags", flags, int)
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"set_release_flags: unknown release flags {flags}")
        self._release_flags = flags

    def _take_reschedule(self) -> bool:
        """Whether execute asked to run it again; the flag is spent by asking."""
        again = self._release_flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return again

    def get_response_sender(self) -> InferenceResponseSender:
        """How to answer this request: any number of responses for a decoupled model, one
        (with the FINAL flag, or followed by it) for any other; ``execute`` then returns
        None."""
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() answers a request the model received, not one it built"
            )
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` (Triton's BLS), blocking until it answers;
        ``decoupled``: an iterator of the responses as they come: a decoupled model's,
        ending with an empty one (Triton's final response), or another model's one."""
        caller = self._bls_caller()
        if decoupled:
            return self._responses(caller)
        try:
            answer = caller.call_sync(self._model_name, self._arrays(), *self._call_options())
        except ReposerveError as exc:
            return InferenceResponse(error=TritonError(exc.message, _code(exc)))
        return self._response(*answer)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` for an ``async def execute``; with ``decoupled`` the iterator comes
        once the first response has (the instance runs other batches meanwhile); the
        responses after it are waited for as it is iterated."""
        caller = self._bls_caller()
        if decoupled:
            stream = await caller.stream(self._model_name, self._arrays(), *self._call_options())
            return ResponseIterator(stream, self._response)
        try:
            answer = await caller.call(self._model_name, self._arrays(), *self._call_options())
        except ReposerveError as exc:
            return InferenceResponse(error=TritonError(exc.message, _code(exc)))
        return self._response(*answer)

    def _call_options(self) -> tuple[int | None, str, int]:
        """The version, parameters and timeout (µs) of the call, as the caller takes them."""
        version = None if self._model_version < 0 else self._model_version
        parameters = self._parameters
        if self._correlation_id or self._flags:  # a call into a sequence, as a client's
            sequence = {
                "sequence_id": self._correlation_id,
                "sequence_start": bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
                "sequence_end": bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
            }
            parameters = _parameters_text({**msgspec.json.decode(parameters), **sequence}, "")
        return version, parameters, self._timeout

    def _responses(self, caller: Any) -> ResponseIterator:
        stream = caller.stream_sync(self._model_name, self._arrays(), *self._call_options())
        return ResponseIterator(stream, self._response)

    def _bls_caller(self) -> Any:
        if not self._model_name:
            raise TritonModelException("exec() needs a request built with model_name=...")
        if not _bls_allowed:
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        if _caller is None:
            raise TritonModelException("no repository to call models in")
        return _caller

    def _arrays(self) -> dict[str, np.ndarray]:
        return {tensor.name(): tensor._array for tensor in self._inputs}

    def _response(self, outputs: dict[str, np.ndarray], parameters: str) -> InferenceResponse:
        wanted = self._requested_output_names or list(outputs)
        missing = [name for name in wanted if name not in outputs]
        if missing:
            return InferenceResponse(
                error=TritonError(
                    f"model '{self._model_name}' has no output {', '.join(missing)} "
                    f"(it has: {', '.join(outputs)})"
                )
            )
        tensors = [Tensor(name, outputs[name]) for name in wanted]
        return InferenceResponse(tensors, parameters=parameters)


class ResponseIterator:
    """The responses of ``exec(decoupled=True)``, as they come; ``cancel()`` cancels the
    call (the callee sees ``is_cancelled()``; what it has not sent ends as a CANCELLED
    error response)."""

    def __init__(self, stream: Any, response: Callable[[dict, str], InferenceResponse]) -> None:
        self._stream = stream
        self._response = response
        self._ended = False

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._ended:
            raise StopIteration
        try:
            outputs, parameters = next(self._stream)
        except ReposerveError as exc:
            self._ended = True
            return InferenceResponse(error=TritonError(exc.message, _code(exc)))
        # No outputs: a decoupled model's end (Triton's empty final response).
        return self._response(outputs, parameters) if outputs else InferenceResponse([])

    def cancel(self) -> None:
        self._stream.cancel()


def _never() -> bool:
    return False


# How a failed model call's kind reads as a TritonError code.
_CODES = {
    ErrorKind.NOT_FOUND: TritonError.NOT_FOUND,
    ErrorKind.INVALID_ARGUMENT: TritonError.INVALID_ARG,
    ErrorKind.UNAVAILABLE: TritonError.UNAVAILABLE,
    ErrorKind.UNSUPPORTED: TritonError.UNSUPPORTED,
    ErrorKind.CANCELLED: TritonError.CANCELLED,
}


def _code(error: ReposerveError) -> int:
    return _CODES.get(error.kind, TritonError.INTERNAL)


class InferenceResponse:
    """The answer to one request: its output tensors (and parameters), or an error that
    fails only it."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = (),
        error: TritonError | None = None,
        parameters: dict | str | None = None,
    ) -> None:
        self._output_tensors = _check_list(
            "InferenceResponse: output_tensors", output_tensors, Tensor, TritonModelException
        )
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse: error: incompatible type {type(error)}")
        self._error = error
        self._parameters = (
            "{}" if parameters is None else _parameters_text(parameters, "InferenceResponse")
        )

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response's parameters, a JSON object's text."""
        return self._parameters


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model of the repository, as the control API's load does:
    ``config`` is Triton's JSON config to use instead of the folder's; ``files`` maps
    ``file:<path>`` to a file's content for the model folder (it needs ``config``)."""
    _check_type("load_model: model_name", model_name, str)
    _check_type("load_model: config", config, str)
    parameters: dict[str, str] = {"config": config} if config else {}
    for key, content in (files or {}).items():
        if not isinstance(key, str) or not isinstance(content, bytes):
            raise TypeError("load_model: files must map str ('file:<path>') to bytes")
        parameters[key] = base64.b64encode(content).decode()
    _control("load", model_name, body=msgspec.json.encode({"parameters": parameters}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model of the repository, as the control API's unload does."""
    _check_type("unload_model: model_name", model_name, str)
    body = {"parameters": {"unload_dependents": bool(unload_dependents)}}
    _control("unload", model_name, body=msgspec.json.encode(body))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether the model (that version, or its newest) is ready to serve."""
    _check_type("is_model_ready: model_name", model_name, str)
    _check_type("is_model_ready: model_version", model_version, str)
    return bool(msgspec.json.decode(_control("ready", model_name, model_version))["ready"])


def _control(action: str, model: str, version: str = "", body: bytes = b"") -> str:
    if _caller is None:
        raise TritonModelException("no repository to control")
    try:
        return _caller.control(action, model, version, body)
    except ReposerveError as exc:
        raise TritonModelException(exc.message) from None


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


_caller: Any = None  # the instance's ModelCaller, for BLS requests (set by the shim)
# False while the model initializes or finalizes: BLS runs only from execute (and the
# threads it starts), as in Triton.
_bls_allowed = True
