"""``reposerve.Server``: a reposerve server inside this Python process.

The same repository, schedulers, batching and instance processes as the command, with
no HTTP between the caller and the service: a call's arrays go as raw tensors to the
service (checked as a gRPC request's are), and its outputs come back as arrays of their
own. The server runs on an event loop of its own, in a thread (``runtime``); each call
crosses to it, so calls from any number of threads batch together as clients' requests
do, and an ``async`` caller awaits it from its own loop without blocking it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack

from reposerve.answers import Answers
from reposerve.embedded.options import Repository, settings_for
from reposerve.embedded.runtime import NOT_STARTED, Runtime
from reposerve.embedded.tensors import (
    CallOptions,
    InferResult,
    Inputs,
    Version,
    infer_arrays,
    request_parts,
    result_of,
    version_text,
)
from reposerve.errors import EmbeddedError, ErrorKind
from reposerve.operations import (
    IndexEntry,
    IndexRequest,
    LoadRequest,
    ModelConfigRequest,
    ModelMetadata,
    ModelMetadataRequest,
    ModelReadyRequest,
    ModelStatistics,
    ModelStatisticsRequest,
    Operation,
    ServerReadyRequest,
    UnloadRequest,
)
from reposerve.server import Server as Lifecycle
from reposerve.settings import Settings

R = TypeVar("R")
CANCELLED = "the request was cancelled (by its caller, or by the server's stop)"
# What a request sent with ``open_stream`` hands on: a response, the error that ended it,
# or None after its last response.
Deliver = Callable[[InferResult | Exception | None], None]


class Server:
    """A server on ``model_repository`` (a folder, or several) with ``options``: the
    command's flags as keywords (``model_control_mode="explicit"``,
    ``load_model=["a", "b"]``). No front listens unless an option asks for one.

    Use as a context manager, or call ``start`` and ``stop``::

        with reposerve.Server("model_repository") as server:
            result = server.infer("add_sub", {"INPUT0": a, "INPUT1": b})
            result.outputs["OUTPUT0"]
    """

    def __init__(
        self, model_repository: Repository | Sequence[Repository], /, **options: Any
    ) -> None:
        self.settings: Settings = settings_for(model_repository, options)
        self._runtime: Runtime | None = None
        self._finalizer: weakref.finalize[[], Server] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, wait_until_ready: bool = True, timeout: float | None = None) -> Server:
        """Start the server and the loading of its models; with ``wait_until_ready``,
        return once that loading is over (a model that failed shows in ``models()``;
        with ``exit_on_error`` the start fails with its reason instead), or fail after
        ``timeout`` seconds."""
        if self._runtime is not None:
            raise EmbeddedError("this server has been started already; make a new one")
        self._runtime = runtime = Runtime()
        # Holds the runtime, not this object: a server dropped without stop() still stops.
        self._finalizer = weakref.finalize(self, runtime.stop)
        try:
            runtime.start(self.settings)
            if wait_until_ready:
                try:
                    runtime.call(self._until_loaded(), timeout=timeout)
                except TimeoutError:
                    raise EmbeddedError(
                        f"the models did not finish loading within {timeout:g} s"
                    ) from None
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every model (requests and streams under way may finish within
        ``exit_timeout_secs``; a call still waiting then gets EmbeddedError) and the
        server's thread. Again, or from several threads, is harmless."""
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._runtime is not None:
            self._runtime.stop()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    async def _until_loaded(self) -> None:
        if (failure := await self._running().start_failure()) is not None:
            raise EmbeddedError(failure)

    # -- the service's operations ----------------------------------------------------------

    def perform(self, operation: Operation[R]) -> R:
        """Any of the service's operations (``reposerve.operations``), as a front would
        ask for it, for its result."""
        return self._call(self._running().service.perform(operation))

    def ready(self, model: str | None = None, version: Version = None) -> bool:
        """The server's readiness, or ``model``'s (its ``version``)."""
        if model is None:
            return self.perform(ServerReadyRequest())
        return self.perform(ModelReadyRequest(model, version_text(version)))

    def models(self, ready: bool = False) -> list[IndexEntry]:
        """The repository's models with their state (``ready``: the ready ones alone)."""
        return self.perform(IndexRequest(ready))

    def load(self, model: str, config: str | None = None) -> None:
        """Load ``model`` (again, if loaded), or with ``config`` (Triton's model config
        JSON) in place of its folder's. Needs ``model_control_mode`` explicit or
        on-demand, as the command's control API does."""
        self.perform(LoadRequest(model, config))

    def unload(self, model: str, unload_dependents: bool = False) -> None:
        self.perform(UnloadRequest(model, unload_dependents))

    def metadata(self, model: str, version: Version = None) -> ModelMetadata:
        return self.perform(ModelMetadataRequest(model, version_text(version)))

    def config(self, model: str, version: Version = None) -> dict[str, Any]:
        """The model's configuration, as Triton's JSON form has it."""
        return self.perform(ModelConfigRequest(model, version_text(version))).config

    def statistics(self, model: str | None = None, version: Version = None) -> ModelStatistics:
        return self.perform(ModelStatisticsRequest(model, version_text(version)))

    # -- inference ------------------------------------------------------------------------

    def infer(self, model: str, inputs: Inputs, **options: Unpack[CallOptions]) -> InferResult:
        """One request's response: ``inputs`` by name as numpy arrays (their dtypes are
        the datatypes sent; str or bytes arrays are BYTES); ``options`` (``CallOptions``):
        the version, the outputs to return, the request's parameters and id."""
        header, raws = request_parts(inputs, options)
        return self._call(self._infer(model, options, header, raws))

    async def infer_async(
        self, model: str, inputs: Inputs, **options: Unpack[CallOptions]
    ) -> InferResult:
        """``infer``, awaited on the caller's event loop; cancelling it cancels the
        request (it leaves its queue, or its model sees it cancelled)."""
        header, raws = request_parts(inputs, options)
        return await self._await(self._infer(model, options, header, raws))

    def stream(
        self, model: str, inputs: Inputs, **options: Unpack[CallOptions]
    ) -> Iterator[InferResult]:
        """Each response of a request, as the model sends it: any number from a decoupled
        model, one from any other. Leaving the loop early cancels the request."""
        header, raws = request_parts(inputs, options)
        answers = self._call(self._answers(model, options, header, raws))
        try:
            while (result := self._call(_next(model, answers), new=False)) is not None:
                yield result
        finally:
            with contextlib.suppress(EmbeddedError):  # a stopped server closed it already
                self._call(_close(answers), new=False)

    async def stream_async(
        self, model: str, inputs: Inputs, **options: Unpack[CallOptions]
    ) -> AsyncIterator[InferResult]:
        """``stream``, on the caller's event loop."""
        header, raws = request_parts(inputs, options)
        answers = await self._await(self._answers(model, options, header, raws))
        try:
            while (result := await self._await(_next(model, answers), new=False)) is not None:
                yield result
        finally:
            with contextlib.suppress(EmbeddedError):  # a stopped server closed it already
                await self._await(_close(answers), new=False)

    def open_stream(
        self, model: str, inputs: Inputs, deliver: Deliver, **options: Unpack[CallOptions]
    ) -> concurrent.futures.Future[None]:
        """Send a request now and hand each of its responses to ``deliver`` as the model
        makes it, then None after the last, or the error that ended it (``deliver`` runs
        on the server's thread: it must not block). A request the service refuses (an
        unknown model, a bad input) raises here. Cancelling the future cancels the
        request (``deliver`` then gets the error saying so)."""
        header, raws = request_parts(inputs, options)
        answers = self._call(self._answers(model, options, header, raws))
        return self._sent(model, answers, deliver)

    def _sent(
        self, model: str, answers: Answers, deliver: Deliver
    ) -> concurrent.futures.Future[None]:
        if self._runtime is None:
            raise EmbeddedError(NOT_STARTED)
        return self._runtime.submit(_delivered(model, answers, deliver), new=False)

    async def _infer(
        self, model: str, options: CallOptions, header: dict[str, Any], raws: list[Any]
    ) -> InferResult:
        return await infer_arrays(self._running().service, model, options, header, raws)

    async def _answers(
        self, model: str, options: CallOptions, header: dict[str, Any], raws: list[Any]
    ) -> Answers:
        version = version_text(options.get("version"))
        return await self._running().service.stream_parts(model, version, header, raws)

    # -- crossing to the server's loop ----------------------------------------------------

    def _running(self) -> Lifecycle:
        if self._runtime is None:
            raise EmbeddedError(NOT_STARTED)
        return self._runtime.running()

    def _call(self, work: Coroutine[Any, Any, R], new: bool = True) -> R:
        if self._runtime is None:
            work.close()
            raise EmbeddedError(NOT_STARTED)
        return self._runtime.call(work, new)

    async def _await(self, work: Coroutine[Any, Any, R], new: bool = True) -> R:
        if self._runtime is None:
            work.close()
            raise EmbeddedError(NOT_STARTED)
        return await self._runtime.wait(work, new)


async def _next(model: str, answers: Answers) -> InferResult | None:
    """The next response of a stream as arrays, or None after its last."""
    try:
        answer = await anext(answers)
    except StopAsyncIteration:
        return None
    with answer:
        return result_of(model, answer)


async def _delivered(model: str, answers: Answers, deliver: Deliver) -> None:
    """Each response of ``answers`` to ``deliver``, then None, or the error that ended it."""
    try:
        while (result := await _next(model, answers)) is not None:
            deliver(result)
    except asyncio.CancelledError:
        deliver(EmbeddedError(CANCELLED, ErrorKind.CANCELLED))
        raise
    except Exception as error:  # every error reaches the caller, whatever its type
        deliver(error)
    else:
        deliver(None)
    finally:
        await answers.aclose()


async def _close(answers: Answers) -> None:
    """Stop a stream its caller left (its model sees the request cancelled)."""
    await answers.aclose()
