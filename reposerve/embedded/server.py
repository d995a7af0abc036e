"""``reposerve.Server``: a reposerve server inside this Python process.

The same repository, schedulers, batching and instance processes as the command, with
no HTTP between the caller and the service: a call's arrays go as raw tensors to the
service (checked as a gRPC request's are), and its outputs come back as arrays of their
own. The server runs on an event loop of its own, in a thread; each call crosses to it,
so calls from any number of threads batch together as clients' requests do, and an
``async`` caller awaits it from its own loop without blocking it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack

import uvloop

from reposerve.answers import Answers
from reposerve.embedded.options import Repository, settings_for
from reposerve.embedded.tensors import CallOptions, InferResult, Inputs, request_parts, result_of
from reposerve.errors import EmbeddedError
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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lifecycle: Lifecycle | None = None
        self._stopped = False

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, wait_until_ready: bool = True, timeout: float | None = None) -> Server:
        """Start the server and the loading of its models; with ``wait_until_ready``,
        return once that loading is over (a model that failed shows in ``models()``;
        with ``exit_on_error`` the start fails with its reason instead)."""
        if self._thread is not None or self._stopped:
            raise EmbeddedError("this server has been started already; make a new one")
        loop = uvloop.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=_run, args=(loop,), name="reposerve", daemon=True)
        self._thread.start()
        try:
            self._lifecycle = self._call(self._open())
            if wait_until_ready:
                self._call(self._until_loaded(), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every model (requests under way may finish within ``exit_timeout_secs``)
        and the server's thread. Again is harmless."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or self._stopped:
            return
        self._stopped = True
        try:
            if self._lifecycle is not None:
                asyncio.run_coroutine_threadsafe(self._lifecycle.close(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    async def _open(self) -> Lifecycle:
        lifecycle = Lifecycle(self.settings, embedded=True)
        await lifecycle.open()
        return lifecycle

    async def _until_loaded(self) -> None:
        lifecycle = self._running()
        await lifecycle.loaded.wait()
        if lifecycle.exit_code:
            failed = [
                f"{entry.name}: {entry.reason}"
                for entry in lifecycle.service.repository.index()
                if entry.reason and entry.state != "READY"
            ]
            raise EmbeddedError(f"the start failed (exit_on_error): {'; '.join(failed)}")

    # -- the service's operations ----------------------------------------------------------

    def perform(self, operation: Operation[R]) -> R:
        """Any of the service's operations (``reposerve.operations``), as a front would
        ask for it, for its result."""
        return self._call(self._running().service.perform(operation))

    def ready(self, model: str | None = None, version: str | None = None) -> bool:
        """The server's readiness, or ``model``'s (its ``version``)."""
        if model is None:
            return self.perform(ServerReadyRequest())
        return self.perform(ModelReadyRequest(model, version))

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

    def metadata(self, model: str, version: str | None = None) -> ModelMetadata:
        return self.perform(ModelMetadataRequest(model, version))

    def config(self, model: str, version: str | None = None) -> dict[str, Any]:
        """The model's configuration, as Triton's JSON form has it."""
        return self.perform(ModelConfigRequest(model, version)).config

    def statistics(self, model: str | None = None, version: str | None = None) -> ModelStatistics:
        return self.perform(ModelStatisticsRequest(model, version))

    # -- inference ------------------------------------------------------------------------

    def infer(self, model: str, inputs: Inputs, **options: Unpack[CallOptions]) -> InferResult:
        """One request's response: ``inputs`` by name as numpy arrays (their dtypes are
        the datatypes sent; str or bytes arrays are BYTES); ``options`` (``CallOptions``):
        the version, the outputs to return, the request's parameters and id."""
        header, raws = request_parts(inputs, options)
        return self._call(self._infer(model, options.get("version"), header, raws))

    async def infer_async(
        self, model: str, inputs: Inputs, **options: Unpack[CallOptions]
    ) -> InferResult:
        """``infer``, awaited on the caller's event loop; cancelling it cancels the
        request (it leaves its queue, or its model sees it cancelled)."""
        header, raws = request_parts(inputs, options)
        return await self._await(self._infer(model, options.get("version"), header, raws))

    def stream(
        self, model: str, inputs: Inputs, **options: Unpack[CallOptions]
    ) -> Iterator[InferResult]:
        """Each response of a request, as the model sends it: any number from a decoupled
        model, one from any other. Leaving the loop early cancels the request."""
        header, raws = request_parts(inputs, options)
        answers = self._call(self._answers(model, options.get("version"), header, raws))
        try:
            while (result := self._call(_next(model, answers))) is not None:
                yield result
        finally:
            if not self._stopped:
                self._call(_close(answers))

    async def stream_async(
        self, model: str, inputs: Inputs, **options: Unpack[CallOptions]
    ) -> AsyncIterator[InferResult]:
        """``stream``, on the caller's event loop."""
        header, raws = request_parts(inputs, options)
        answers = await self._await(self._answers(model, options.get("version"), header, raws))
        try:
            while (result := await self._await(_next(model, answers))) is not None:
                yield result
        finally:
            if not self._stopped:
                await self._await(_close(answers))

    async def _infer(
        self, model: str, version: str | None, header: dict[str, Any], raws: list[Any]
    ) -> InferResult:
        answer = await self._running().service.infer_parts(model, version, header, raws)
        with answer:
            return result_of(model, answer)

    async def _answers(
        self, model: str, version: str | None, header: dict[str, Any], raws: list[Any]
    ) -> Answers:
        return await self._running().service.stream_parts(model, version, header, raws)

    # -- crossing to the server's loop ----------------------------------------------------

    def _running(self) -> Lifecycle:
        if self._stopped:
            raise EmbeddedError("this server has stopped")
        if self._lifecycle is None:
            raise EmbeddedError("this server is not started: call start() first")
        return self._lifecycle

    def _submit(self, work: Coroutine[Any, Any, R]) -> concurrent.futures.Future[R]:
        loop = self._loop
        if loop is None or self._stopped:
            work.close()
            self._running()  # says which
            raise AssertionError("unreachable")
        if threading.current_thread() is self._thread:
            work.close()
            raise EmbeddedError(
                "called from the server's own thread (a model's code, or a callback of the "
                "server): a blocking call there would wait for itself; use the async calls"
            )
        return asyncio.run_coroutine_threadsafe(work, loop)

    def _call(self, work: Coroutine[Any, Any, R], timeout: float | None = None) -> R:
        future = self._submit(work)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise EmbeddedError(f"no answer within {timeout:g} s") from None
        except BaseException:
            future.cancel()  # an interrupted caller: its request goes too
            raise

    def _await(self, work: Coroutine[Any, Any, R]) -> Awaitable[R]:
        return asyncio.wrap_future(self._submit(work))


def _run(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


async def _next(model: str, answers: Answers) -> InferResult | None:
    """The next response of a stream as arrays, or None after its last."""
    try:
        answer = await anext(answers)
    except StopAsyncIteration:
        return None
    with answer:
        return result_of(model, answer)


async def _close(answers: Answers) -> None:
    """Stop a stream its caller left (its model sees the request cancelled)."""
    await answers.aclose()
