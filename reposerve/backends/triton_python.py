"""Models written for Triton's python backend (``class TritonPythonModel``), run unchanged.

A compatibility layer over reposerve's python model contract inside the instance process,
not a second backend path: reposerve's scheduler forms the batch as for any model, and
this shim turns it into Triton's calls. The lifecycle, as Triton documents it:

1. ``TritonPythonModel()``, then ``initialize(args)`` (optional) with Triton's args, every
   value a string: ``model_config`` (the config as JSON, what ``GET .../config`` shows),
   ``model_instance_kind`` (``CPU``/``GPU``), ``model_instance_name`` (``<group>_<n>``),
   ``model_instance_device_id`` (the CUDA device as the instance process sees it: ``0``,
   since each GPU instance sees only its own device), ``model_repository`` (the model's
   folder), ``model_version``, ``model_name``.
2. ``execute(requests)`` (may be ``async def``) gets one ``pb_utils.InferenceRequest`` per
   client request of the batch, in order; each input tensor is a slice of the batch array
   (the request's items on axis 0). It returns one ``InferenceResponse`` per request; the
   outputs are joined back into the batch in request order.
3. A response with ``error=pb_utils.TritonError(message, code)`` fails only its request, with
   the status Triton gives the code (INTERNAL, the default, is a 500; INVALID_ARG a 400);
   so does a response whose outputs do not fit its request. An exception from ``execute``,
   or a response list of the wrong length, fails the call: the scheduler's fault isolation
   then runs the batch again in halves, so only the requests at fault fail.
4. ``finalize()`` (optional) when the instance stops.

A decoupled model (``model_transaction_policy { decoupled: true }``) returns None from
``execute`` and answers through each request's response sender, from ``execute`` or from
threads it starts, until every request has had its FINAL flag. A sync ``execute`` runs on
a thread of its own, so each response streams out the moment it is sent (a sender blocks
once a few wait unread: a slow client slows the model); an ``async def`` one runs on the
instance's event loop. When the client goes, ``is_cancelled()`` turns true and what is
sent after that is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import threading
import traceback
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from functools import partial

import msgspec
import numpy as np

from reposerve.backends import pb_config, pb_utils
from reposerve.backends.base import (
    Answers,
    Arrays,
    BackendError,
    ModelContext,
    Outputs,
    RequestFailure,
    RequestResponse,
    RequestSlice,
    Responses,
    Signature,
)
from reposerve.backends.drive import run_now
from reposerve.backends.pb_logging import start_logging
from reposerve.backends.pb_reschedule import run_until_released, run_until_released_async
from reposerve.config import ModelConfig
from reposerve.config.instances import instance_kind, instance_name
from reposerve.config.triton_json import parse_triton_config
from reposerve.errors import ErrorKind, ModelError, ReposerveError
from reposerve.protocol.documents import model_config

# Triton's error codes -> how the front reports them (Triton's HTTP statuses; it answers
# UNSUPPORTED with 501, which reposerve has no kind for: 500).
_ERROR_KINDS = {
    pb_utils.TritonError.UNKNOWN: ErrorKind.UNKNOWN,
    pb_utils.TritonError.INTERNAL: ErrorKind.INTERNAL,
    pb_utils.TritonError.NOT_FOUND: ErrorKind.NOT_FOUND,
    pb_utils.TritonError.INVALID_ARG: ErrorKind.INVALID_ARGUMENT,
    pb_utils.TritonError.UNAVAILABLE: ErrorKind.UNAVAILABLE,
    pb_utils.TritonError.UNSUPPORTED: ErrorKind.UNSUPPORTED,
    pb_utils.TritonError.ALREADY_EXISTS: ErrorKind.ALREADY_EXISTS,
    pb_utils.TritonError.CANCELLED: ErrorKind.CANCELLED,
}


class TritonResponseError(BackendError):
    """``execute`` answered the call in a way that fails every request of it."""


def _never(index: int) -> bool:
    return False


@contextlib.contextmanager
def _without_bls() -> Iterator[None]:
    """Around initialize and finalize: Triton runs BLS requests only from execute."""
    pb_utils._bls_allowed = False
    try:
        yield
    finally:
        pb_utils._bls_allowed = True


class TritonPythonBackend:
    def __init__(self, model_class: type, context: ModelContext, where: str) -> None:
        auto_complete = getattr(model_class, "auto_complete_config", None)
        if callable(auto_complete):
            context = msgspec.structs.replace(
                context, config=_auto_completed(auto_complete, context, where)
            )
        self.completed_config = config = context.config
        self._instance = instance_name(context.model_name, config, context.instance_index)
        self._where = where
        self._batched = config.max_batch_size > 0
        self._output_names = [spec.name for spec in config.output]
        self._bf16_inputs = frozenset(spec.name for spec in config.input if spec.datatype == "BF16")
        start_logging(context.model_name)
        pb_utils._caller = context.caller
        self._model = model_class()
        execute = getattr(self._model, "execute", None)
        if not callable(execute):
            raise BackendError(
                f"{where}: class TritonPythonModel has no execute(self, requests) method"
            )
        self._execute = execute
        self.is_async = inspect.iscoroutinefunction(execute)
        self.decoupled = config.decoupled
        # Triton asks the model itself whether it is ready, when it has a way to say.
        is_ready = getattr(self._model, "is_ready", None)
        self.check_ready: Callable[[], object] | None = is_ready if callable(is_ready) else None
        initialize = getattr(self._model, "initialize", None)
        if callable(initialize):
            with _without_bls():
                initialize(triton_args(context))

    def signature(self) -> Signature | None:
        return None  # the config declares the tensors

    def execute(self, inputs: Arrays) -> Answers | Awaitable[Answers] | Responses:
        """The whole batch as one request (the worker calls ``execute_requests``)."""
        items = next(iter(inputs.values())).shape[0] if self._batched and inputs else 1
        return self.execute_requests(inputs, [RequestSlice(items, "")], _never)

    def execute_requests(
        self,
        inputs: Arrays,
        requests: Sequence[RequestSlice],
        cancelled: Callable[[int], bool] = _never,
    ) -> Answers | Awaitable[Answers] | Responses:
        if self.decoupled:
            return self._stream(inputs, requests, cancelled)
        sent = _SentOnce(len(requests))
        triton_requests = self._split(inputs, requests, sent.put, cancelled, decoupled=False)
        answers = self._execute_batch(triton_requests, requests, sent)
        return answers if self.is_async else run_now(answers)

    def _failed(self, exc: Exception) -> ModelError:
        """An exception from execute as Triton reports it (its clients check the words)."""
        return ModelError(
            f"Failed to process the request(s) for model '{self._instance}', message: "
            f"{type(exc).__name__}: {exc}"
        )

    def unload(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        if callable(finalize):
            with _without_bls():
                finalize()

    async def _execute_batch(
        self,
        triton_requests: list[pb_utils.InferenceRequest],
        requests: Sequence[RequestSlice],
        sent: _SentOnce,
    ) -> Answers:
        """Execute, sync or async (a sync instance drives this with ``run_now``), and its
        answers: what it returned, or what it sent through the senders."""
        try:
            if self.is_async:
                returned = await run_until_released_async(self._execute, triton_requests)
            else:
                returned = run_until_released(self._execute, triton_requests)
        except Exception as exc:
            if not sent.any():
                raise self._failed(exc) from exc  # the scheduler isolates the one at fault
            returned = exc  # the requests already answered keep their answers
        if returned is None:  # answered through the senders, maybe from other threads
            if self.is_async:
                await asyncio.to_thread(sent.wait)
            else:
                sent.wait()
        return self._answers(returned, requests, sent)

    async def _stream(
        self, inputs: Arrays, requests: Sequence[RequestSlice], flagged: Callable[[int], bool]
    ) -> AsyncGenerator[RequestResponse, None]:
        """A decoupled execute's responses as they are sent: a sync execute runs on a thread
        of its own, an async one on the instance's loop (``_ThreadSent``, ``_LoopSent``)."""
        sent: _ThreadSent | _LoopSent = _LoopSent() if self.is_async else _ThreadSent()

        def cancelled(index: int) -> bool:
            return sent.cancelled or flagged(index)

        answers = _Answers(self._instance, requests, self._answer)
        triton_requests = self._split(inputs, requests, answers.counting(sent.put), cancelled)

        def settle(result: Callable[[], object]) -> None:
            """Execute has ended: ``result`` gives what it returned, or raises what it raised
            (to the requests still open; to the log when none is left to hear it)."""
            try:
                answers.check_return(result())
            except Exception as exc:
                if sent.cancelled or answers.all_sent:
                    answers.log_unheard(exc)
                else:
                    sent.put(exc)

        rounds = run_until_released_async if self.is_async else run_until_released
        sent.start(partial(rounds, self._execute, triton_requests), settle)
        try:
            while answers.open:
                yield answers.take(await sent.get())
        finally:
            sent.cancel()

    def _split(
        self,
        inputs: Arrays,
        requests: Sequence[RequestSlice],
        put: Callable[[_Sent], None],
        cancelled: Callable[[int], bool],
        decoupled: bool = True,
    ) -> list[pb_utils.InferenceRequest]:
        """One InferenceRequest per client request, its tensors views of the batch, each
        with a response sender delivering (index, response, final) to ``put`` and
        ``cancelled(its index)`` behind its ``is_cancelled()``."""
        triton_requests = []
        start = 0
        for index, request in enumerate(requests):
            stop = start + request.items
            tensors = [
                self._tensor(name, array[start:stop] if self._batched else array)
                for name, array in inputs.items()
            ]
            is_cancelled = partial(cancelled, index)
            sender = pb_utils.InferenceResponseSender(
                partial(_deliver, put, index), is_cancelled, decoupled
            )
            wanted = self._output_names if request.outputs is None else request.outputs
            triton_requests.append(
                pb_utils.InferenceRequest._received(
                    tensors,
                    request.id,
                    list(wanted),
                    request.parameters,
                    sender,
                    is_cancelled,
                    request.timeout_us,
                    request.correlation_id,
                    request.flags,
                )
            )
            start = stop
        return triton_requests

    def _tensor(self, name: str, array: np.ndarray) -> pb_utils.Tensor:
        if name in self._bf16_inputs:
            return pb_utils.Tensor._of_bf16(name, array)
        return pb_utils.Tensor(name, array)

    def _answers(
        self, returned: object, requests: Sequence[RequestSlice], sent: _SentOnce
    ) -> Answers:
        """What execute returned, or (None) what it sent, as one answer per request: its
        outputs as the model gave them, or its failure alone. A response sent through a
        request's sender is that request's answer whatever execute did after (Triton's
        first response wins); ``returned`` an exception fails the others with it."""
        count = len(requests)
        if returned is None:
            returned = sent.responses
        if isinstance(returned, Exception):
            failure = f"{type(returned).__name__}: {returned}"
            return [
                self._answer(index, response, request, final=True)
                if response is not None
                else RequestResponse(
                    index, {}, True, RequestFailure(index, failure, ErrorKind.INTERNAL)
                )
                for index, (response, request) in enumerate(
                    zip(sent.responses, requests, strict=True)
                )
            ]
        if not isinstance(returned, list | tuple) or len(returned) != count:
            got = (
                f"{len(returned)} responses"
                if isinstance(returned, list | tuple)
                else type(returned).__name__
            )
            raise TritonResponseError(
                f"{self._where}: TritonPythonModel.execute returned {got} for {count} "
                "request(s). Hint: return a list with one pb_utils.InferenceResponse per "
                "request, in the order of the requests"
            )
        answers: Answers = []
        for index, response in enumerate(returned):
            response = sent.responses[index] or response
            if not isinstance(response, pb_utils.InferenceResponse):
                raise TritonResponseError(
                    f"{self._where}: execute returned {type(response).__name__} as response "
                    f"{index}. Hint: every element must be a pb_utils.InferenceResponse"
                )
            answers.append(self._answer(index, response, requests[index], final=True))
        return answers

    def _answer(
        self,
        index: int,
        response: pb_utils.InferenceResponse,
        request: RequestSlice,
        final: bool,
    ) -> RequestResponse:
        """One response to request ``index``: its error, or the outputs the request asked
        for (Triton prunes the rest), as the model shaped them."""
        error = response.error()
        if error is not None:
            return RequestResponse(index, {}, final, _failure(index, error))
        arrays: Outputs = {tensor.name(): tensor._array for tensor in response.output_tensors()}
        undeclared = [name for name in arrays if name not in self._output_names]
        if undeclared:
            problem = (
                f"the response holds output '{undeclared[0]}', which the config does not "
                "declare. Hint: declare it, or leave it out of the response"
            )
            return RequestResponse(
                index, {}, final, RequestFailure(index, problem, ErrorKind.INTERNAL)
            )
        if request.outputs is not None:
            arrays = {name: array for name, array in arrays.items() if name in request.outputs}
        return RequestResponse(index, arrays, final, parameters=response.parameters())


class _SentOnce:
    """What a non-decoupled model sent through its requests' senders, one response each
    (FINAL with it or after it); ``wait`` blocks until every request has been answered."""

    def __init__(self, count: int) -> None:
        self.responses: list[pb_utils.InferenceResponse | None] = [None] * count
        self._open = count
        self._done = threading.Condition()

    def any(self) -> bool:
        """Whether some request has had its response."""
        return any(response is not None for response in self.responses)

    def put(self, item: _Sent) -> None:
        index, response, final = item
        with self._done:
            if response is not None:
                self.responses[index] = response
            if final:
                self._open -= 1
                self._done.notify_all()

    def wait(self) -> None:
        with self._done:
            while self._open:
                self._done.wait()


# Responses a sync decoupled model may send ahead of its client before a send blocks.
SENT_AHEAD = 4

_Sent = tuple[int, pb_utils.InferenceResponse | None, bool]
"""What a request's response sender sent: (the request's index, the response or None for
a flag-only FINAL, whether it is the request's last)."""


def _deliver(
    put: Callable[[_Sent], None],
    index: int,
    response: pb_utils.InferenceResponse | None,
    final: bool,
) -> None:
    put((index, response, final))


Settle = Callable[[Callable[[], object]], None]


class _ThreadSent:
    """A sync decoupled execute, run on a thread of its own, and what its senders sent, in
    order, for the instance's main thread to take (``get`` blocks it: a sync instance
    drives the stream without a loop). A sender blocks while SENT_AHEAD wait; once
    cancelled, sends are dropped."""

    def __init__(self) -> None:
        self._items: deque[_Sent | Exception] = deque()
        self._changed = threading.Condition()
        self.cancelled = False

    def start(self, execute: Callable[[], object], settle: Settle) -> None:
        threading.Thread(
            target=settle, args=(execute,), name="reposerve-decoupled-execute", daemon=True
        ).start()

    def put(self, item: _Sent | Exception) -> None:
        with self._changed:
            while len(self._items) >= SENT_AHEAD and not self.cancelled:
                self._changed.wait()
            if not self.cancelled:
                self._items.append(item)
                self._changed.notify_all()

    async def get(self) -> _Sent | Exception:
        with self._changed:
            while not self._items:
                self._changed.wait()
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    def cancel(self) -> None:
        with self._changed:
            self.cancelled = True
            self._items.clear()
            self._changed.notify_all()


class _LoopSent:
    """An async decoupled execute, run as a task on the instance's loop, and what its
    senders sent (from the loop or from threads of the model's), in order."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[_Sent | Exception] = asyncio.Queue()
        self._task: asyncio.Future | None = None  # held: the loop keeps only weak ones
        self.cancelled = False

    def start(self, execute: Callable[[], Awaitable[object]], settle: Settle) -> None:
        def ended(done: asyncio.Future) -> None:
            if not done.cancelled():
                settle(done.result)

        self._task = asyncio.ensure_future(execute())
        self._task.add_done_callback(ended)

    def put(self, item: _Sent | Exception) -> None:
        if not self.cancelled:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)

    async def get(self) -> _Sent | Exception:
        return await self._items.get()

    def cancel(self) -> None:
        self.cancelled = True


class _Answers:
    """Turns what a decoupled model's senders sent into ``RequestResponse``s and counts
    the requests that have not had their FINAL flag."""

    def __init__(
        self,
        instance: str,
        requests: Sequence[RequestSlice],
        answer: Callable[[int, pb_utils.InferenceResponse, RequestSlice, bool], RequestResponse],
    ) -> None:
        self._instance = instance  # Triton's name for it, in its messages
        self._requests = requests
        self._answer = answer
        self.open = len(requests)
        self._finished: set[int] = set()  # the requests whose FINAL flag has been sent

    def counting(self, put: Callable[[_Sent], None]) -> Callable[[_Sent], None]:
        """``put`` for the senders, noting each FINAL flag as it is sent (before it is
        taken), so that an error raised after the last one is known to reach nobody."""

        def send(item: _Sent) -> None:
            index, _, final = item
            if final:
                self._finished.add(index)
            put(item)

        return send

    @property
    def all_sent(self) -> bool:
        """Every request has been sent its FINAL flag."""
        return len(self._finished) == len(self._requests)

    def log_unheard(self, exc: Exception) -> None:
        """An error from execute that no request is left to carry (every one has had its
        FINAL flag, or its client has gone): into the server's log, as Triton logs it."""
        print(
            f"model instance '{self._instance}': execute raised after its requests were "
            "answered; no client sees this error:",
            file=sys.stderr,
        )
        traceback.print_exception(exc, file=sys.stderr)

    def check_return(self, returned: object) -> None:
        if returned is not None:
            raise ModelError(  # Triton's words, which its tests compare
                f"Python model '{self._instance}' is using the decoupled mode and the "
                f"execute function must return None. (It returned {type(returned).__name__}: "
                "send each response through request.get_response_sender().)"
            )

    def take(self, item: _Sent | Exception) -> RequestResponse:
        if isinstance(item, Exception):
            raise item
        index, response, final = item
        if final:
            self.open -= 1
        if response is None:  # a flag-only FINAL
            return RequestResponse(index, {}, final=True)
        return self._answer(index, response, self._requests[index], final)


def _failure(index: int, error: object) -> RequestFailure:
    if isinstance(error, pb_utils.TritonError):
        kind = _ERROR_KINDS.get(error.code(), ErrorKind.INTERNAL)
        return RequestFailure(index, error.message(), kind)
    return RequestFailure(index, str(error), ErrorKind.INTERNAL)


def _auto_completed(
    auto_complete: Callable[[pb_config.ModelConfig], object], context: ModelContext, where: str
) -> ModelConfig:
    """The config as the model's ``auto_complete_config`` leaves it (Triton calls it once,
    before ``initialize``, with the config as Triton's JSON)."""
    document = msgspec.json.decode(model_config(context.model_name, "python", context.config))
    if not context.config.decoupled:
        # Every config reposerve writes holds the default (not decoupled), where Triton's
        # leaves an unset policy out: a model (vLLM's) may still declare itself decoupled
        # here, as it may under Triton. (An explicit false reads the same: it is let go.)
        document.pop("model_transaction_policy", None)
    try:
        with _without_bls():
            completed = auto_complete(pb_config.ModelConfig(document))
    except ValueError as exc:  # the model's edit contradicts the configuration
        raise BackendError(f"{where}: auto_complete_config: {exc}") from None
    if not isinstance(completed, pb_config.ModelConfig):
        raise BackendError(
            f"{where}: auto_complete_config returned {type(completed).__name__}. Hint: "
            "return the pb_utils.ModelConfig it was given"
        )
    try:
        return parse_triton_config(
            msgspec.json.encode(completed.as_dict()).decode(),
            f"{where}: auto_complete_config",
            context.model_name,
        )
    except ReposerveError as exc:
        raise BackendError(exc.message) from None


def triton_args(context: ModelContext) -> dict[str, str]:
    """The ``args`` Triton passes to ``initialize``: every key and value a string."""
    kind, _, device = context.device.partition(":")
    return {
        "model_config": model_config(context.model_name, "python", context.config).decode(),
        "model_instance_kind": (
            "MODEL"
            if instance_kind(context.config, context.instance_index) == "model"
            else "GPU"
            if kind == "cuda"
            else "CPU"
        ),
        "model_instance_name": instance_name(
            context.model_name, context.config, context.instance_index
        ),
        "model_instance_device_id": device or "0",
        "model_repository": str(context.version_path.parent),
        "model_version": str(context.version),
        "model_name": context.model_name,
    }
