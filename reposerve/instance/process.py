"""The front's handle on one instance process: spawn, load, run batches, stop.

Each instance keeps books on the batches it has in flight (``books``), so when its
process dies exactly those batches fail (and nothing else), and the owner is told through
``on_exit``. A batch that outlives the model's execution timeout (``watchdog``) gets the
process killed: a hung execute cannot be interrupted any other way, and the replacement
serves the requests still queued. This class owns the process and its socket: it turns
frames into bookings and outcomes, and the books' decisions into frames.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import partial

import msgspec

from reposerve.backends.base import MetricFamilyGone, MetricState, ModelLog, RequestSlice
from reposerve.config import ModelConfig
from reposerve.errors import ErrorKind, InstanceError
from reposerve.framing import FrameReader
from reposerve.instance.arena import Slot, align
from reposerve.instance.books import Batch, Books
from reposerve.instance.call_slots import CallSlots
from reposerve.instance.custom_metrics import CustomMetrics
from reposerve.instance.messages import (
    Call,
    CallCancel,
    CallFailure,
    CallNext,
    CallResponse,
    CallResult,
    CallSlotClosed,
    CallTaken,
    Cancel,
    Execute,
    Failure,
    FromInstance,
    Load,
    LoadFailed,
    ModelControl,
    Ready,
    ReadyAnswer,
    Response,
    Result,
    Resume,
    Shutdown,
    TensorRef,
    ToInstance,
    encode_frame,
)
from reposerve.instance.outcomes import (
    BatchFailure,
    BatchOutcome,
    BatchTensor,
    FailureCause,
    OnEvent,
    PartUnreadable,
    RequestOutputs,
    SlotHold,
    StreamedResponse,
    response_parameters,
    views,
)
from reposerve.instance.readiness import ReadinessCheck
from reposerve.instance.slot_pool import SlotPool
from reposerve.instance.spawn import spawn
from reposerve.instance.spec import InstanceSpec
from reposerve.instance.watchdog import Watchdog
from reposerve.tensor import FileUnreadable, FileWindow

log = logging.getLogger("reposerve.instance")

REAP_TIMEOUT_S = 5.0  # a killed process is gone within this, even with a large CUDA context


class InstanceState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    EXITED = "exited"


OnCall = Callable[["InstanceProcess", Call | ModelControl | CallNext | CallCancel], None]
"""A model's call to a model (``context.infer``): the owner answers with ``answer_call``."""


class InstanceProcess:
    def __init__(
        self,
        spec: InstanceSpec,
        on_exit: Callable[[InstanceProcess], None],
        on_call: OnCall | None = None,
    ) -> None:
        self.spec = spec
        self._on_call = on_call
        self._call_slots = CallSlots()
        self.state = InstanceState.STARTING
        self.per_request = False  # whether its backend wants each batch's request slices
        self.config: ModelConfig | None = None  # as completed by the backend, once READY
        self.readiness: ReadinessCheck | None = None  # the model's own check, if it has one
        self.custom_metrics = CustomMetrics()  # the model's own, as the process reports them
        self._on_exit = on_exit
        self._process: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._transport: asyncio.Transport | None = None
        self._slots = SlotPool(
            f"{spec.model}-{spec.index}", self._send_with_fd, self._send, self._idle
        )
        self._loop = asyncio.get_running_loop()
        self._books = Books()
        self._watchdog = Watchdog(spec.execute_timeout_s, self._books, self._loop, self._overran)
        self._ready: asyncio.Future[None] | None = None
        self._closed = asyncio.Event()
        self._exit_report: asyncio.Task | None = None  # held so the task is not collected
        self.ended = ""  # how the process ended ("was killed by SIGKILL"), once it has
        # Ended for one batch's sake (it hung past the timeout, or hit a CUDA error that
        # poisons the process), not because the model is broken: no crash-loop count.
        self.batch_fault = False

    @property
    def in_flight(self) -> int:
        return len(self._books)

    @property
    def live(self) -> bool:
        return self.state is InstanceState.READY

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def has_capacity(self, staged: bool = False) -> bool:
        """Whether it takes a batch now: to run at once, or (``staged``) to run next."""
        limit = self._books.limit(staged)
        if self.state is not InstanceState.READY or len(self._books) >= limit:
            return False
        if self._slots.has_free:
            return True
        # No slot is free, yet the books have room: a batch that ended still has leases
        # out on its slot (the front encodes from it). A new one spares the next batch that
        # wait, up to twice the batches it may hold. Its fd goes out beside the socket's
        # byte stream; only while nothing is queued in the transport does it keep its place.
        return (
            len(self._slots) < 2 * self._books.limit(staged=True)
            and self._transport is not None
            and self._transport.get_write_buffer_size() == 0
        )

    async def start(self, timeout: float) -> None:
        """Spawn the process and wait until its backend has loaded."""
        loop = self._loop
        parent_sock, child_sock = socket.socketpair()
        self._process = spawn(self.spec, child_sock.fileno())
        child_sock.close()
        self._sock = parent_sock
        spec = self.spec
        parent_sock.sendall(
            encode_frame(
                Load(
                    model=spec.model,
                    version=spec.version,
                    version_path=spec.version_path,
                    backend=spec.backend,
                    config=spec.config_json,
                    instance_index=spec.index,
                    device="cpu" if spec.gpu is None else "cuda:0",
                    threads=spec.threads,
                )
            )
        )
        self._ready = loop.create_future()
        self._transport, _ = await loop.connect_accepted_socket(
            lambda: _Channel(self), sock=parent_sock
        )
        self._slots.grow()
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            self.kill()
            raise InstanceError(f"{spec.label}: did not load within {timeout:g} s") from None
        except InstanceError:
            self.kill()
            raise
        finally:
            if not self._ready.done():  # nobody waits for it now (timed out, or cancelled)
                self._ready.cancel()

    def run(
        self,
        inputs: Sequence[BatchTensor],
        on_event: OnEvent,
        requests: Sequence[RequestSlice] = (),
        call_depth: int = 0,
    ) -> int:
        """Assemble a batch into a free slot and send it; ``on_event`` receives what
        becomes of it: ``STARTED`` when it begins to run (now, or once the batch ahead of
        it is answered when it was staged), a decoupled model's responses, then its
        outcome. ``requests``: the client requests it holds, in order (none: one request
        holding the whole batch). Returns the batch's id (what ``cancel`` takes)."""
        if self._transport is None or self.state is not InstanceState.READY:
            raise OSError(f"{self.spec.label} is {self.state.value}")
        slot_index = self._slots.take()
        slot = self._slots[slot_index]
        refs: list[TensorRef] = []
        # The slot opens with one cancel flag per request (see cancel_request), zeroed.
        slot.ensure(len(requests))
        slot.buffer[: len(requests)] = bytes(len(requests))
        offset = align(len(requests)) if requests else 0
        for tensor in inputs:
            nbytes = sum(len(part) for part in tensor.parts)
            refs.append(TensorRef(tensor.name, tensor.datatype, tensor.shape, offset, nbytes))
            offset = align(offset + nbytes)
        slot.ensure(offset)
        view = memoryview(slot.buffer)
        for ref, tensor in zip(refs, inputs, strict=True):
            position = ref.offset
            for index, part in enumerate(tensor.parts):
                end = position + len(part)
                if isinstance(part, FileWindow):
                    try:
                        part.copy_into(view[position:end])
                    except FileUnreadable as exc:
                        self._slots.give_back(slot_index)
                        raise PartUnreadable(index, str(exc)) from None
                else:
                    view[position:end] = part
                position = end
        hold = SlotHold(partial(self._slots.give_back, slot_index))
        batch_id = self._books.add(slot_index, hold, on_event, self._loop.time())
        self._transport.write(
            encode_frame(
                Execute(
                    batch_id,
                    slot_index,
                    slot.size,
                    refs,
                    list(requests),
                    call_depth,
                )
            )
        )
        self._watchdog.arm()
        return batch_id

    def cancel(self, batch_id: int) -> None:
        """Ask the process to stop a decoupled batch (its clients have gone); the batch
        still ends with its outcome, after the responses it had produced."""
        if self._transport is None or not self._books.cancel(batch_id, self._loop.time()):
            return
        self._watchdog.arm()
        self._transport.write(encode_frame(Cancel(batch_id)))

    def cancel_request(self, batch_id: int, index: int) -> None:
        """Raise request ``index``'s cancel flag in its batch's slot: the model reads it
        there (``is_cancelled()``) whatever it is doing, without a frame to wait for."""
        running = self._books.get(batch_id)
        # Only per-request batches carry the flags (the others' slots open with inputs).
        if running is not None and self.per_request:
            self._slots[running.slot].buffer[index] = 1

    def call_slot(self, call: Call) -> Slot:
        """The shared memory a call's inputs lie in (opened through /proc, once per
        memfd; mapped again when the process grew it). Raises OSError once it is gone."""
        return self._call_slots.open(self.pid, call)

    def answer_call(self, reply: CallResult | CallResponse | CallFailure) -> None:
        self._send(reply)

    def _send(self, message: ToInstance) -> None:
        if self._transport is not None and self.state is not InstanceState.EXITED:
            self._transport.write(encode_frame(message))

    def _overran(self, batch_id: int) -> None:
        """A batch passed the execution timeout: it fails with that, the process is killed."""
        running = self._books.answered(batch_id, self._loop.time(), next_starts=False)
        assert running is not None  # the watchdog names only batches on the books
        limit = self.spec.execute_timeout_s
        log.error("%s: execute ran past %g s; killing the instance", self.spec.label, limit)
        self.batch_fault = True
        running.on_event(
            BatchFailure(
                f"execute did not finish within {limit:g} s (execution.timeout_seconds); "
                "the instance was killed and is being replaced",
                FailureCause.INSTANCE,
            )
        )
        self.kill(
            f"instance {self.spec.index} was killed: another batch on it ran past "
            f"execution.timeout_seconds ({limit:g} s)"
        )

    async def stop(self, timeout: float) -> None:
        """Ask the process to finish its batches and exit; kill it after ``timeout``."""
        if self.state is InstanceState.READY and self._transport is not None:
            self.state = InstanceState.STOPPING
            self._transport.write(encode_frame(Shutdown()))
            deadline = time.monotonic() + timeout
            try:
                await asyncio.wait_for(self._closed.wait(), timeout)
                await asyncio.to_thread(self._exit_code, max(deadline - time.monotonic(), 0))
            except TimeoutError:
                pass
        self.kill()
        # Reaped before this returns (off the loop, bounded), so a server that exits once
        # its instances are stopped leaves no process behind, not even for a moment.
        await asyncio.to_thread(self._exit_code, REAP_TIMEOUT_S)

    def kill(self, reason: str | None = None, cause: FailureCause = FailureCause.INSTANCE) -> None:
        """End the process now (idempotent). Its in-flight batches fail, with ``reason``
        and ``cause`` when given, else with how the process ended once that is known."""
        if self.state is InstanceState.READY:
            self.state = InstanceState.STOPPING  # takes no more batches from here on
        if reason is not None:
            self._fail_in_flight(reason, cause)
        if self._process is not None and self._process.poll() is None:
            self._process.kill()  # reaped by _report_exit on a thread, never on the loop
        if self._transport is not None:
            self._transport.abort()
        self._close_slots()

    def _close_slots(self) -> None:
        """Let go of the shared memory (views still held keep their mappings)."""
        self._slots.close()
        self._call_slots.close()

    def _exit_code(self, timeout: float = 5.0) -> int | None:
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _send_with_fd(self, frame: bytes, fd: int) -> None:
        assert self._sock is not None and self._transport is not None
        # Sent on the raw socket so the fd rides as ancillary data with the frame's first
        # byte; a short write leaves the rest to the transport, which keeps the order.
        sent = socket.send_fds(self._sock, [frame], [fd])
        if sent < len(frame):
            self._transport.write(frame[sent:])

    def _idle(self) -> bool:
        return not self._books and self.state is InstanceState.READY

    def _on_message(self, message: FromInstance) -> None:
        match message:
            case Result(batch_id=batch_id):
                running = self._books.answered(batch_id, self._loop.time())
                if running is None:  # it overran its timeout and was failed already
                    return
                try:
                    outcome: BatchOutcome | BatchFailure = self._outcome(message, running)
                except (OSError, ValueError) as exc:  # off the books already: answer it
                    outcome = BatchFailure(
                        f"{self.spec.label}: its outputs could not be read: {exc}",
                        FailureCause.INSTANCE,
                    )
                try:
                    running.on_event(outcome)
                finally:
                    running.hold.release()
            case Response():
                self._on_response(message)
            case CallTaken():
                self._books.call_taken(message.call_id)
            case CallSlotClosed(fd=fd):  # the process shrank its call slots
                self._call_slots.closed(fd)
            case MetricState() | MetricFamilyGone():
                self.custom_metrics.apply(message)
            case ModelLog():  # through the server's logging, and its settings
                logging.getLogger(f"reposerve.model.{self.spec.model}").log(
                    message.level, message.message
                )
            case Call() | ModelControl() | CallNext() | CallCancel():
                if isinstance(message, Call) and message.nested:  # room for a nested batch
                    self._books.call_waits(message.call_id, self._loop.time())
                if self._on_call is not None:
                    self._on_call(self, message)
                else:
                    reason = "no repository to call models in"
                    self.answer_call(CallFailure(message.call_id, reason, ErrorKind.UNAVAILABLE))
            case Failure(batch_id=batch_id):
                running = self._books.answered(
                    batch_id, self._loop.time(), next_starts=not message.fatal
                )
                if running is None:
                    return
                if message.fatal:  # the process ends itself; take nothing more meanwhile
                    log.error("%s: %s", self.spec.label, message.message)
                    self.batch_fault = True
                    if self.state is InstanceState.READY:
                        self.state = InstanceState.STOPPING
                running.hold.release()
                cause = FailureCause.INVALID_INPUT if message.invalid_input else FailureCause.MODEL
                running.on_event(BatchFailure(message.message, cause, message.verbatim))
            case Ready():
                self._books.max_inflight = message.max_inflight
                self._books.staging = message.staging
                self.per_request = message.per_request
                self.config = msgspec.json.decode(message.config, type=ModelConfig)
                if message.ready_check:
                    self.readiness = ReadinessCheck(self.spec.name, self._send)
                self.state = InstanceState.READY
                if self._ready and not self._ready.done():
                    self._ready.set_result(None)
            case ReadyAnswer():
                if self.readiness is not None:
                    self.readiness.answered(message)
            case LoadFailed():
                if self._ready and not self._ready.done():
                    self._ready.set_exception(
                        InstanceError(f"{self.spec.label}: load failed: {message.reason}")
                    )

    def _outcome(self, message: Result, running: Batch) -> BatchOutcome:
        """A finished batch's outputs, as views on its slot."""
        slot = self._slots[running.slot]
        slot.remap(message.slot_size)
        view = memoryview(slot.buffer)
        answers = {
            answer.request: RequestOutputs(
                views(view, answer.outputs), response_parameters(answer.parameters)
            )
            for answer in message.answers
        }
        return BatchOutcome(
            views(view, message.outputs), message.compute_ns, running.hold, message.failed, answers
        )

    def _on_response(self, message: Response) -> None:
        running = self._books.get(message.batch_id)
        if running is None:  # it overran its timeout and was failed already
            return
        slot = self._slots[running.slot]
        slot.remap(message.slot_size)
        outputs = views(memoryview(slot.buffer), message.outputs)
        batch_id = message.batch_id
        # The response's outputs keep the slot until it is resumed, even past the batch's
        # end (the model may stop right after its last response).
        hold = running.hold.share()
        resumed = False

        def resume() -> None:
            nonlocal resumed
            if resumed:
                return
            resumed = True
            hold.release()
            if self._transport is not None and self._books.resume(batch_id, self._loop.time()):
                self._transport.write(encode_frame(Resume(batch_id)))
                self._watchdog.arm()

        running.paused = True
        running.on_event(
            StreamedResponse(
                outputs,
                message.request,
                message.final,
                message.failure,
                response_parameters(message.parameters),
                resume,
            )
        )

    def _on_closed(self) -> None:
        was = self.state
        self.state = InstanceState.EXITED
        self._closed.set()
        # A process that died by itself: its slots go now, not with this object (which
        # a replacement outlives), whatever is still failed or reported below.
        self._close_slots()
        if self.readiness is not None:
            self.readiness.gone()
        # The socket closes a moment before the process can be reaped; wait for its exit
        # status so the error says how it ended.
        self._exit_report = self._loop.create_task(self._report_exit(was))

    async def _report_exit(self, was: InstanceState) -> None:
        code = await asyncio.to_thread(self._exit_code)
        if code is None:
            how = "closed its connection"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        self.ended = how
        if self._ready and not self._ready.done():
            triton = f"Stub process '{self.spec.name}' is not healthy."  # tests look for it
            error = InstanceError(f"{self.spec.label}: {how} while loading ({triton})")
            self._ready.set_exception(error)
        self._fail_in_flight(
            f"instance {self.spec.index} (pid {self.pid}) {how} while running this batch"
        )
        if was in (InstanceState.READY, InstanceState.STOPPING):
            self._on_exit(self)

    def _fail_in_flight(self, reason: str, cause: FailureCause = FailureCause.INSTANCE) -> None:
        """Fail the batches the process held (``Books.fail_all``)."""
        self._watchdog.stop()
        self._books.fail_all(reason, cause)


class _Channel(asyncio.Protocol):
    def __init__(self, instance: InstanceProcess) -> None:
        self._instance = instance
        self._reader = FrameReader(FromInstance)

    def data_received(self, data: bytes) -> None:
        for message in self._reader.feed(data):
            self._instance._on_message(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self._instance._on_closed()
