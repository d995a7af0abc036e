"""Instance process main: load one backend, then run batches until told to stop.

The pipeline per batch (``BatchRunner.run``, one path for both kinds of model): map the
slot -> numpy views on the inputs -> execute -> check the outputs against the config ->
write them into the slot after the inputs -> one Result frame. A sync model runs batches
one at a time on the main thread, driving that path without an event loop; an async
model runs many at once on an event loop while a reader thread takes frames off the socket.

Started by ``reposerve.instance.process`` as ``python -m reposerve.instance.worker FD``.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import msgspec

from reposerve.backends import Backend, ModelContext, create_backend, pb_metrics, pb_utils
from reposerve.backends.base import BackendError
from reposerve.backends.drive import run_now
from reposerve.config import ModelConfig, complete_config
from reposerve.config.parameters import server_parameters
from reposerve.errors import ReposerveError
from reposerve.instance.calls import Caller
from reposerve.instance.channel import Channel, Nested
from reposerve.instance.messages import (
    AddSlot,
    CallFailure,
    CallResult,
    Cancel,
    DropSlot,
    Execute,
    Failure,
    Load,
    LoadFailed,
    Ready,
    ReadyAnswer,
    Result,
    Resume,
    ToInstance,
)
from reposerve.instance.runner import BatchRunner

T = TypeVar("T")

EXIT_POISONED = 70  # the process ended itself after a CUDA error poisoned its context
_PR_SET_PDEATHSIG = 1


def _answer(channel: Channel, reply: Result | Failure) -> None:
    channel.send(reply)
    if isinstance(reply, Failure) and reply.fatal:
        # The answer is in the socket; nothing more can run here, and tearing down a
        # poisoned CUDA context can hang: leave at once, the front starts a replacement.
        os._exit(EXIT_POISONED)


def _run_sync(channel: Channel, runner: BatchRunner) -> None:
    async def resumed(batch_id: int) -> bool:
        return channel.wait_resume(batch_id)  # blocks this thread: nothing else runs here

    def serve(message: Nested) -> None:
        if isinstance(message, Execute):
            _answer(channel, run_now(runner.run(message, channel, resumed)))
        elif isinstance(message, DropSlot):
            runner.drop_slot(message)
        else:
            runner.add_slot(message, channel.take_fd())

    channel.serve = serve
    while True:
        message = channel.receive()
        if isinstance(message, Execute | AddSlot | DropSlot):
            serve(message)
        elif not isinstance(message, Resume | Cancel | CallResult | CallFailure):
            return  # (those are of a batch, or a call, already ended)


class _AsyncStream:
    """A decoupled batch on an async instance: its task, the Resume it waits for, and
    whether it has begun running and whether its clients have gone."""

    def __init__(self, task: asyncio.Task) -> None:
        self.task = task
        self.resumed = asyncio.Event()
        self.running = False
        self.cancelled = False

    async def resume(self) -> bool:
        """Its Resume; a Cancel cancels the task instead (CancelledError)."""
        await self.resumed.wait()
        self.resumed.clear()
        return True


def _run_async(
    channel: Channel, runner: BatchRunner, caller: Caller, loop: asyncio.AbstractEventLoop
) -> None:
    caller.serve_async(loop)
    tasks: set[asyncio.Task] = set()
    stopped = asyncio.Event()

    streams: dict[int, _AsyncStream] = {}  # the decoupled batches not answered yet

    async def resumed(batch_id: int) -> bool:
        return await streams[batch_id].resume()

    async def execute(message: Execute) -> None:
        stream = streams.get(message.batch_id)
        try:
            if stream is not None and stream.cancelled:  # its clients left before it began
                reply: Result | Failure = Result(message.batch_id, message.slot_size, [], 0)
            else:
                if stream is not None:
                    stream.running = True  # from here a Cancel cancels this task
                reply = await runner.run(message, channel, resumed)
        finally:
            streams.pop(message.batch_id, None)
        _answer(channel, reply)

    def deliver(message: ToInstance | None) -> None:
        if isinstance(message, Execute):
            task = loop.create_task(execute(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if runner.decoupled:
                streams[message.batch_id] = _AsyncStream(task)
        elif isinstance(message, CallResult | CallFailure):
            caller.deliver(message)
        elif isinstance(message, Resume | Cancel):
            stream = streams.get(message.batch_id)
            if stream is None:  # that batch has ended already
                return
            if isinstance(message, Resume):
                stream.resumed.set()
            else:
                stream.cancelled = True
                if stream.running:  # a task not begun would never answer if cancelled
                    stream.task.cancel()
        else:
            stopped.set()

    def read() -> None:
        while True:
            message = channel.receive()
            if isinstance(message, AddSlot):
                # The fd must be taken on this thread, in frame order.
                fd = channel.take_fd()
                loop.call_soon_threadsafe(runner.add_slot, message, fd)
                continue
            if isinstance(message, DropSlot):  # after the AddSlots before it, in order
                loop.call_soon_threadsafe(runner.drop_slot, message)
                continue
            loop.call_soon_threadsafe(deliver, message)
            if not isinstance(message, Execute | Resume | Cancel | CallResult | CallFailure):
                return

    async def main() -> None:
        threading.Thread(target=read, name="reposerve-reader", daemon=True).start()
        await stopped.wait()
        if tasks:
            await asyncio.wait(tasks)

    loop.run_until_complete(main())
    loop.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _answer_readiness(
    channel: Channel, check: Callable[[], object], loop: asyncio.AbstractEventLoop | None
) -> None:
    """Answer the front's ReadyQuery frames on a thread of its own, so that a readiness
    check waits for no batch and no batch waits for it. A coroutine check runs on the
    instance's event loop (an async model's), else on one of its own."""
    while (query := channel.wait_query()) is not None:
        try:
            ready = check()
            if inspect.isawaitable(ready):
                if loop is not None:
                    ready = asyncio.run_coroutine_threadsafe(_awaited(ready), loop).result()
                else:
                    ready = asyncio.run(_awaited(ready))
            if type(ready) is not bool:
                raise TypeError("is_ready() must return a boolean value")
            answer = ReadyAnswer(query.query_id, ready)
        except Exception as exc:
            answer = ReadyAnswer(query.query_id, False, f"{type(exc).__name__}: {exc}")
        channel.send(answer)


def _transaction_policy(config: ModelConfig, backend: Backend, model: str) -> ModelConfig:
    """The config with ``decoupled`` as the backend is: a generator execute makes the
    model decoupled; ``decoupled = true`` without one is a load error."""
    decoupled = getattr(backend, "decoupled", False)
    if config.decoupled and not decoupled:
        raise BackendError(
            f"model '{model}': its config says decoupled (model_transaction_policy), but the "
            "model answers once per batch. Hint: a python model's execute yields each "
            "response (a generator); onnxruntime and torch models cannot be decoupled"
        )
    return msgspec.structs.replace(config, decoupled=True) if decoupled else config


def _die_with_parent() -> None:
    """Ask the kernel to kill us if the front dies, so no instance outlives it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: EOF on the socket still ends us
        pass


def main(argv: list[str]) -> int:
    _die_with_parent()
    # Ctrl-C reaches the whole process group; the front decides when instances stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = Channel(socket.socket(fileno=int(argv[1])))
    # Model code sees an embedded interpreter's argv, not the instance's (a model that
    # runs unittest.main() parses it).
    sys.argv = [""]
    pb_metrics.connect(channel.send)
    pb_utils.connect_logs(channel.send)
    load = channel.receive()
    if not isinstance(load, Load):
        return 2
    config = msgspec.json.decode(load.config, type=ModelConfig)
    caller = Caller(channel, load.model)
    context = ModelContext(
        model_name=load.model,
        config=config,
        version=load.version,
        version_path=Path(load.version_path),
        device=load.device,
        instance_index=load.instance_index,
        threads=load.threads,
        caller=caller,
    )
    try:
        backend = create_backend(load.backend, context)
        # A Triton python model's auto_complete_config may have completed it.
        config = getattr(backend, "completed_config", config)
        signature = backend.signature()
        if signature is not None:
            config = complete_config(config, *signature, label=f"{load.model}/config.toml")
        if not (config.input or config.output):  # and its model file named none
            raise BackendError(
                f"model '{load.model}': declares no tensors. Hint: declare [[input]] and "
                "[[output]] in config.toml (input and output in config.pbtxt), or add them "
                "in a TritonPythonModel's auto_complete_config"
            )
        config = _transaction_policy(config, backend, load.model)
        # Checked when the config was read (reposerve.config.parameters).
        options = server_parameters(config.parameters, f"{load.model}/config.toml")
        inflight = options.max_inflight_batches if backend.is_async else 1
        # Staging: a sync instance accepts one batch beyond the one it runs, so it starts
        # the next the moment it answers instead of waiting a round trip through the front
        # (and a GPU does not idle while the front assembles the batch). A decoupled batch
        # may run for long: nothing waits staged behind it.
        staging = int(options.stage_next_batch and not (backend.is_async or config.decoupled))
    except ReposerveError as exc:
        channel.send(LoadFailed(exc.message))
        return 1
    except Exception as exc:
        traceback.print_exception(exc, file=sys.stderr)
        channel.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
        return 1
    runner = BatchRunner(backend, config)
    per_request = hasattr(backend, "execute_requests")
    check_ready = getattr(backend, "check_ready", None)
    loop = asyncio.new_event_loop() if backend.is_async else None
    if check_ready is not None:
        threading.Thread(
            target=_answer_readiness,
            args=(channel, check_ready, loop),
            name="reposerve-readiness",
            daemon=True,
        ).start()
    encoded = msgspec.json.encode(config)
    channel.send(Ready(inflight, staging, encoded, per_request, check_ready is not None))
    try:
        if loop is not None:
            _run_async(channel, runner, caller, loop)
        else:
            _run_sync(channel, runner)
    finally:
        backend.unload()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv))
