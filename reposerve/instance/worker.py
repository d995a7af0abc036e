"""Instance process main: load one backend, then run batches until told to stop.

The pipeline per batch: map the slot -> numpy views on the inputs -> execute -> check the
outputs against the config -> write them into the slot after the inputs -> one Result frame.
A sync model runs batches one at a time on the main thread; an async model runs many at
once on an event loop while a reader thread takes frames off the socket.

Started by ``reposerve.instance.process`` as ``python -m reposerve.instance.worker FD``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from reposerve.backends import Backend, ModelContext, create_backend
from reposerve.backends.base import (
    BackendError,
    DeviceOutput,
    PartialOutputs,
    RequestResponse,
    RequestSlice,
)
from reposerve.config import ModelConfig, complete_config
from reposerve.datatypes import NUMPY_DTYPES, element_count, to_numpy, to_wire
from reposerve.errors import InvalidInput, ReposerveError
from reposerve.instance.arena import Slot, align
from reposerve.instance.calls import Caller
from reposerve.instance.faults import Aftermath, aftermath, free_device_memory
from reposerve.instance.messages import (
    AddSlot,
    CallFailure,
    CallResult,
    Cancel,
    Execute,
    Failure,
    FrameReader,
    FromInstance,
    Load,
    LoadFailed,
    Ready,
    Response,
    Result,
    Resume,
    TensorRef,
    ToInstance,
    encode_frame,
)

# How many batches one async instance may hold at once unless [parameters] says otherwise.
DEFAULT_ASYNC_INFLIGHT = 256
_MAX_FDS_PER_READ = 16
EXIT_POISONED = 70  # the process ended itself after a CUDA error poisoned its context
_PR_SET_PDEATHSIG = 1


Output = np.ndarray | DeviceOutput | bytes | memoryview  # BYTES: already framed


class OutputError(Exception):
    """What execute returned does not match the model's declared outputs."""


class Channel:
    """The worker's end of the socket: blocking reads (with passed fds), locked writes."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = FrameReader(ToInstance)
        self._messages: deque = deque()
        self._deferred: deque = deque()  # read while a decoupled batch waited, not yet run
        self._replies: dict[int, CallResult | CallFailure] = {}  # to calls further out
        # Runs an Execute or AddSlot that arrives while a model waits on a call (sync).
        self.serve: Callable[[ToInstance], None] | None = None
        self._fds: deque[int] = deque()
        self._write_lock = threading.Lock()

    def receive(self) -> ToInstance | None:
        """The next message, or None once the front has gone."""
        if self._deferred:
            return self._deferred.popleft()
        return self._next()

    def wait_resume(self, batch_id: int) -> bool:
        """Block until the front lets decoupled batch ``batch_id`` write its next response:
        True on its Resume, False on its Cancel or once the front has gone. Other frames
        wait their turn for ``receive``, in order."""
        while True:
            message = self._next()
            if message is None:
                return False
            if isinstance(message, Resume | Cancel) and message.batch_id == batch_id:
                return isinstance(message, Resume)
            self._deferred.append(message)

    def wait_call(self, call_id: int) -> CallResult | CallFailure | None:
        """Block until model call ``call_id`` is answered; None once the front has gone.
        Batches given meanwhile run now, nested (the waiting one cannot go on before its
        answer, which may need them); other frames wait their turn for ``receive``."""
        while call_id not in self._replies:
            message = self._next()
            if message is None:
                return None
            if isinstance(message, CallResult | CallFailure):
                self._replies[message.call_id] = message
            elif isinstance(message, Execute | AddSlot) and self.serve is not None:
                self.serve(message)
            else:
                self._deferred.append(message)
        return self._replies.pop(call_id)

    def _next(self) -> ToInstance | None:
        while not self._messages:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self._sock, 1 << 16, _MAX_FDS_PER_READ)
            except OSError:
                return None
            if not data:
                return None
            self._fds.extend(fds)
            self._messages.extend(self._reader.feed(data))
        return self._messages.popleft()

    def take_fd(self) -> int:
        return self._fds.popleft()

    def send(self, message: FromInstance) -> None:
        frame = encode_frame(message)
        with self._write_lock:
            self._sock.sendall(frame)


class BatchRunner:
    """Runs Execute frames against the backend, reading and writing the slots."""

    def __init__(self, backend: Backend, config: ModelConfig) -> None:
        self.backend = backend
        self.slots: dict[int, Slot] = {}
        self._config = config
        self._output_names = frozenset(spec.name for spec in config.output)
        self._batched = config.max_batch_size > 0
        # Optional hooks of backends that copy to a device (``StagingBackend``).
        self._register = getattr(backend, "register_host_buffer", None)
        self._synchronize = getattr(backend, "synchronize", None)
        self._registered: set[int] = set()  # ids of the mappings handed to the backend
        # Optional: a backend that answers per request (``RequestAwareBackend``).
        self._execute_requests = getattr(backend, "execute_requests", None)
        self.decoupled = config.decoupled

    def add_slot(self, message: AddSlot, fd: int) -> None:
        slot = Slot(fd, message.size)
        self.slots[message.slot] = slot
        self._pin(slot)

    def prepare(self, message: Execute) -> tuple[Slot, dict[str, np.ndarray]]:
        slot = self.slots[message.slot]
        slot.remap(message.slot_size)
        self._pin(slot)
        view = memoryview(slot.buffer)
        inputs = {
            ref.name: to_numpy(ref.datatype, ref.shape, view[ref.offset : ref.offset + ref.nbytes])
            for ref in message.inputs
        }
        return slot, inputs

    def execute(self, message: Execute, inputs: dict[str, np.ndarray]) -> Any:
        """Run the backend on the batch: per request when it asks for the boundaries."""
        if self._execute_requests is None:
            return self.backend.execute(inputs)
        requests = message.requests
        if not requests:  # one request holding the whole batch (warmup)
            items = message.inputs[0].shape[0] if self._batched and message.inputs else 1
            requests = [RequestSlice(items, "")]
        return self._execute_requests(inputs, requests)

    def finish(
        self, message: Execute, slot: Slot, outputs: object, started_ns: int
    ) -> Result | Failure:
        """Check the outputs and write each straight into the slot, after the inputs."""
        compute_ns = time.perf_counter_ns() - started_ns
        failed = []
        if isinstance(outputs, PartialOutputs):
            failed = outputs.failures
            if len(failed) >= max(len(message.requests), 1):  # nothing left to send
                return Result(message.batch_id, slot.size, [], compute_ns, failed)
            outputs = outputs.outputs
        try:
            refs = self._place(message, slot, outputs)
        except OutputError as exc:  # the front names the model and version
            return Failure(message.batch_id, str(exc), invalid_input=False)
        return Result(message.batch_id, slot.size, refs, compute_ns, failed)

    def stream(
        self, message: Execute, slot: Slot, responses: Iterator, started_ns: int, channel: Channel
    ) -> Result | Failure:
        """Send each response of a decoupled batch as it comes, then end the batch. The
        next response is produced while the front reads the last one, and written only
        once the front says it has (``Resume``); a ``Cancel`` closes the generator."""
        sent = False
        waited_ns = 0  # for its clients: not compute time
        try:
            for outputs in responses:
                if sent:
                    waiting = time.perf_counter_ns()
                    resumed = channel.wait_resume(message.batch_id)
                    waited_ns += time.perf_counter_ns() - waiting
                    if not resumed:
                        break  # its clients have gone
                channel.send(self._response(message, slot, outputs))
                sent = True
        except OutputError as exc:
            return Failure(message.batch_id, str(exc), invalid_input=False)
        finally:
            responses.close()  # at once: the model sees GeneratorExit at its yield
        compute_ns = time.perf_counter_ns() - started_ns - waited_ns
        return Result(message.batch_id, slot.size, [], compute_ns)

    async def stream_async(
        self,
        message: Execute,
        slot: Slot,
        responses: AsyncIterator,
        started_ns: int,
        channel: Channel,
        resumed: asyncio.Event,
    ) -> Result | Failure:
        """``stream`` for an async generator; a cancel arrives as CancelledError."""
        sent = False
        waited_ns = 0
        try:
            async for outputs in responses:
                if sent:
                    waiting = time.perf_counter_ns()
                    await resumed.wait()
                    resumed.clear()
                    waited_ns += time.perf_counter_ns() - waiting
                channel.send(self._response(message, slot, outputs))
                sent = True
        except OutputError as exc:
            return Failure(message.batch_id, str(exc), invalid_input=False)
        except asyncio.CancelledError:
            pass  # its clients have gone
        finally:
            # A cancel while the model cleans up: it is ending already.
            with contextlib.suppress(asyncio.CancelledError):
                await responses.aclose()
        compute_ns = time.perf_counter_ns() - started_ns - waited_ns
        return Result(message.batch_id, slot.size, [], compute_ns)

    def _response(self, message: Execute, slot: Slot, produced: object) -> Response:
        """One response: to every request of the batch, or (``RequestResponse``) to one."""
        if not isinstance(produced, RequestResponse):
            refs = self._place(message, slot, produced)  # first: it may grow the slot
            return Response(message.batch_id, slot.size, refs)
        if not 0 <= produced.index < max(len(message.requests), 1):
            raise OutputError(f"a response to request {produced.index}, which the batch lacks")
        if produced.failure is not None:
            return Response(message.batch_id, slot.size, [], produced.index, True, produced.failure)
        refs = []
        if produced.outputs or not produced.final:  # a final one may carry nothing
            items = message.requests[produced.index].items if message.requests else None
            refs = self._place(message, slot, produced.outputs, items)
        return Response(message.batch_id, slot.size, refs, produced.index, produced.final)

    def _place(
        self, message: Execute, slot: Slot, outputs: object, items: int | None = None
    ) -> list[TensorRef]:
        """Check the outputs (of ``items`` on axis 0, default the whole batch's) and write
        each straight into the slot, after the inputs."""
        batch_size = message.inputs[0].shape[0] if message.inputs else 1
        checked = self._check_outputs(outputs, batch_size if items is None else items)
        end = max((ref.offset + ref.nbytes for ref in message.inputs), default=0)
        offset = align(end)
        placed: list[tuple[TensorRef, Output]] = []
        for name, datatype, value in checked:
            shape = tuple(value.shape)
            if datatype == "BYTES":  # framed here: its size is known only once packed
                value = to_wire(datatype, value)
                nbytes = len(value)
            else:
                nbytes = element_count(shape) * value.dtype.itemsize
            placed.append((TensorRef(name, datatype, shape, offset, nbytes), value))
            offset = align(offset + nbytes)
        slot.ensure(offset)
        self._pin(slot)
        try:
            for ref, value in placed:
                if isinstance(value, bytes | memoryview):
                    slot.buffer[ref.offset : ref.offset + ref.nbytes] = value
                    continue
                target = np.ndarray(value.shape, value.dtype, slot.buffer, ref.offset)
                if isinstance(value, np.ndarray):
                    np.copyto(target, value)
                else:
                    value.copy_into(target)
        finally:
            # Even when a copy failed: none may land after the front took the slot back.
            if self._synchronize is not None:
                self._synchronize()
        return [ref for ref, _ in placed]

    def failure(self, message: Execute, exc: BaseException) -> Failure:
        if isinstance(exc, InvalidInput):  # the model's own words about the client's data
            return Failure(message.batch_id, exc.message, invalid_input=True)
        traceback.print_exception(exc, file=sys.stderr)
        text = f"{type(exc).__name__}: {exc}"
        outcome = aftermath(exc)
        if outcome is Aftermath.OUT_OF_MEMORY:
            free_device_memory()
        elif outcome is Aftermath.POISONED:
            return Failure(
                message.batch_id,
                f"{text} (a CUDA error that leaves the device unusable in this process: "
                "the instance is being replaced)",
                invalid_input=False,
                fatal=True,
            )
        return Failure(message.batch_id, text, invalid_input=False)

    def _pin(self, slot: Slot) -> None:
        if self._register is not None and id(slot.buffer) not in self._registered:
            self._registered.add(id(slot.buffer))
            try:
                self._register(slot.buffer)
            except Exception as exc:  # unpinned memory is slower, never wrong
                print(f"shared memory not pinned, copies stay synchronous: {exc}", file=sys.stderr)

    def _check_outputs(self, outputs: object, batch_size: int) -> list[tuple[str, str, Output]]:
        """The outputs in config order, as their declared datatypes (``_conform``)."""
        if not isinstance(outputs, dict):
            raise OutputError(
                f"execute() must return a dict of arrays, got {type(outputs).__name__}"
            )
        undeclared = [str(name) for name in outputs if name not in self._output_names]
        if undeclared:
            raise OutputError(
                f"execute() returned undeclared output(s) {', '.join(undeclared)}. "
                "Hint: declare them as [[output]] in config.toml, or stop returning them"
            )
        batched = self._config.max_batch_size > 0
        checked: list[tuple[str, str, Output]] = []
        for spec in self._config.output:
            if spec.name not in outputs:
                returned = ", ".join(map(str, outputs)) or "nothing"
                raise OutputError(
                    f"execute() returned no output '{spec.name}' (returned: {returned})"
                )
            where = f"output '{spec.name}'"
            value = outputs[spec.name]
            if hasattr(value, "copy_into"):  # a DeviceOutput: already in the declared dtype
                if spec.datatype == "BYTES" or value.dtype != NUMPY_DTYPES[spec.datatype]:
                    raise OutputError(f"{where}: expected {spec.datatype}, got {value.dtype}")
            else:
                value = _conform(np.asarray(value), spec.datatype, where)
            dims = tuple(value.shape)
            if batched:
                if not dims or dims[0] != batch_size:
                    raise OutputError(
                        f"{where}: expected {batch_size} items on axis 0, got shape {list(dims)}"
                    )
                dims = dims[1:]
            if len(dims) != len(spec.shape) or any(
                want not in (-1, got) for want, got in zip(spec.shape, dims, strict=True)
            ):
                raise OutputError(f"{where}: expected item shape {spec.shape}, got {list(dims)}")
            checked.append((spec.name, spec.datatype, value))
        return checked


def _conform(array: np.ndarray, datatype: str, where: str) -> np.ndarray:
    """The one rule for an output whose dtype differs from its declared datatype.

    It is converted when numpy's ``same_kind`` casting allows it (float64 -> FP32,
    int64 -> INT32, int -> float, bool -> int) and every value fits the declared type;
    a conversion across kinds (float -> int, int -> bool, numbers <-> BYTES) or a value
    that does not fit (300 as UINT8, 1e39 as FP32) is an error naming the output.
    """
    if datatype == "BYTES":
        if array.dtype.kind not in "OSU":
            raise OutputError(f"{where}: expected BYTES (bytes objects), got {array.dtype}")
        return array
    dtype = NUMPY_DTYPES[datatype]
    if array.dtype == dtype:
        return array
    if not np.can_cast(array.dtype, dtype, "same_kind"):
        raise OutputError(
            f"{where}: expected {datatype}, got {array.dtype}, which does not convert without "
            "changing its meaning. Hint: return the declared type, or declare this one"
        )
    converted = array.astype(dtype)
    if np.can_cast(array.dtype, dtype, "safe") or array.size == 0:
        return converted
    if dtype.kind == "f":
        lost = np.isinf(converted) & np.isfinite(array)
    else:  # integers: a value that did not survive the round trip did not fit
        lost = converted.astype(array.dtype) != array
    if lost.any():
        bad = array[lost].flat[0]
        raise OutputError(f"{where}: value {bad} returned as {array.dtype} does not fit {datatype}")
    return converted


def _answer(channel: Channel, reply: Result | Failure) -> None:
    channel.send(reply)
    if isinstance(reply, Failure) and reply.fatal:
        # The answer is in the socket; nothing more can run here, and tearing down a
        # poisoned CUDA context can hang: leave at once, the front starts a replacement.
        os._exit(EXIT_POISONED)


def _run_sync(channel: Channel, runner: BatchRunner) -> None:
    def serve(message: ToInstance) -> None:
        if isinstance(message, Execute):
            started = time.perf_counter_ns()
            try:
                slot, inputs = runner.prepare(message)
                outputs = runner.execute(message, inputs)
                if runner.decoupled:
                    reply = runner.stream(message, slot, outputs, started, channel)
                else:
                    reply = runner.finish(message, slot, outputs, started)
            except Exception as exc:
                reply = runner.failure(message, exc)
            _answer(channel, reply)
        else:
            runner.add_slot(message, channel.take_fd())

    channel.serve = serve
    while True:
        message = channel.receive()
        if isinstance(message, Execute | AddSlot):
            serve(message)
        elif not isinstance(message, Resume | Cancel):  # those of a batch already ended
            return


class _AsyncStream:
    """A decoupled batch on an async instance: its task, the Resume it waits for, and
    whether it has begun running and whether its clients have gone."""

    def __init__(self, task: asyncio.Task) -> None:
        self.task = task
        self.resumed = asyncio.Event()
        self.running = False
        self.cancelled = False


def _run_async(channel: Channel, runner: BatchRunner, caller: Caller) -> None:
    loop = asyncio.new_event_loop()
    caller.serve_async(loop)
    tasks: set[asyncio.Task] = set()
    stopped = asyncio.Event()

    streams: dict[int, _AsyncStream] = {}  # the decoupled batches not answered yet

    async def execute(message: Execute) -> None:
        started = time.perf_counter_ns()
        try:
            slot, inputs = runner.prepare(message)
            if runner.decoupled:
                stream = streams[message.batch_id]
                if stream.cancelled:  # its clients left before it began
                    reply = Result(message.batch_id, slot.size, [], 0)
                else:
                    stream.running = True  # from here a Cancel cancels this task
                    responses = runner.execute(message, inputs)
                    reply = await runner.stream_async(
                        message, slot, responses, started, channel, stream.resumed
                    )
            else:
                outputs = await runner.execute(message, inputs)
                reply = runner.finish(message, slot, outputs, started)
        except Exception as exc:
            reply = runner.failure(message, exc)
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


def _max_inflight(config: ModelConfig) -> int:
    value = config.parameters.get("max_inflight_batches", DEFAULT_ASYNC_INFLIGHT)
    if type(value) is not int or value < 1:
        raise ValueError(f"parameters.max_inflight_batches: expected int >= 1, got {value!r}")
    return value


def _staging(config: ModelConfig) -> int:
    """Batches a sync instance accepts beyond the one it runs: with one staged in shared
    memory, it starts the next the moment it answers instead of waiting a round trip
    through the front (and a GPU does not idle while the front assembles the batch)."""
    value = config.parameters.get("stage_next_batch", True)
    if type(value) is not bool:
        raise ValueError(f"parameters.stage_next_batch: expected true or false, got {value!r}")
    return int(value)


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
        signature = backend.signature()
        if signature is not None:
            config = complete_config(config, *signature, label=f"{load.model}/config.toml")
        config = _transaction_policy(config, backend, load.model)
        inflight = _max_inflight(config) if backend.is_async else 1
        # A decoupled batch may run for long: nothing waits staged behind it.
        staging = 0 if backend.is_async or config.decoupled else _staging(config)
    except ReposerveError as exc:
        channel.send(LoadFailed(exc.message))
        return 1
    except Exception as exc:
        traceback.print_exception(exc, file=sys.stderr)
        channel.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
        return 1
    runner = BatchRunner(backend, config)
    per_request = hasattr(backend, "execute_requests")
    channel.send(Ready(inflight, staging, msgspec.json.encode(config), per_request))
    try:
        if backend.is_async:
            _run_async(channel, runner, caller)
        else:
            _run_sync(channel, runner)
    finally:
        backend.unload()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv))
