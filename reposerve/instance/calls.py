"""A model's calls to models of the repository (``context.infer``), from its instance.

A call's inputs are written into a call slot, a memfd of this process that the front
opens through /proc; one ``Call`` frame names it. The front runs the call through the
callee's scheduler like any request and writes the outputs into the same slot, after the
inputs, answering ``CallResult`` (or ``CallFailure``). Slots are pooled: a call takes one,
the answer's outputs are copied out, and the slot is free again.

A sync model blocks in ``infer_sync``; called from execute itself, its instance keeps
serving the batches it is given meanwhile, nested, so a model can call itself, or every
instance of a model wait on a callee, without a deadlock: the front counts each such call
as room for one more batch until the caller says it has taken the answer (``CallTaken``):
a caller answered while batches run above it still waits for them. A call from a thread
of the model's own (a decoupled model's sender thread) just waits for its answer, which
whichever thread reads the socket hands it. An async model awaits ``infer``, its
instance running other batches as it always does.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import threading
from collections.abc import Callable, Generator
from typing import Protocol

import numpy as np

from reposerve.datatypes import NUMPY_DTYPES, to_numpy, to_wire
from reposerve.errors import ModelCallError
from reposerve.instance.arena import Slot, align
from reposerve.instance.messages import (
    Call,
    CallCancel,
    CallFailure,
    CallNext,
    CallResponse,
    CallResult,
    CallSlotClosed,
    CallTaken,
    FromInstance,
    ModelControl,
    TensorRef,
)

# numpy dtype -> V2 datatype (BF16 has none: its uint16 bit patterns call as UINT16).
KEEP_CALL_SLOTS = 2  # call slots kept once no call is under way
_DATATYPES = {dtype: name for name, dtype in NUMPY_DTYPES.items() if name != "BF16"}

Reply = CallResult | CallResponse | CallFailure

# The call depth of the batch whose execute runs here (Execute.call_depth), set by the
# worker around it: its calls are one deeper, so the front can end a runaway recursion.
CALL_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("call_depth", default=0)


class CallChannel(Protocol):
    def send(self, message: FromInstance) -> None: ...

    def expect(self, call_id: int) -> None:
        """That call's answer is for ``wait_call`` (a sync caller)."""
        ...

    def wait_call(self, call_id: int) -> Reply | None:
        """Block until that call's answer (serving what else arrives); None: the front
        has gone."""
        ...

    def when_answered(self, call_id: int, callback: Callable[[], object]) -> None:
        """Call ``callback`` (from any thread) once that call has an answer waiting."""
        ...


class Caller:
    """``ModelContext.caller``: the instance's end of model calls."""

    def __init__(self, channel: CallChannel, model: str) -> None:
        self._channel = channel
        self._model = model
        self._ids = itertools.count()
        self._free: list[Slot] = []
        self._slots: dict[int, Slot] = {}  # calls under way -> their slot
        self._loop: asyncio.AbstractEventLoop | None = None  # an async instance's
        self._answers: dict[int, asyncio.Future[Reply]] = {}
        self._pid = os.getpid()  # a forked child shares the socket: it may not call

    def serve_async(self, loop: asyncio.AbstractEventLoop) -> None:
        """Answers arrive on ``loop`` (through ``deliver``), for ``await infer``."""
        self._loop = loop

    def deliver(self, reply: Reply) -> None:
        answer = self._answers.pop(reply.call_id, None)
        if answer is None or answer.done():  # its caller was cancelled: nobody takes it
            slot = self._slots.pop(reply.call_id, None)
            if slot is not None:
                self._pool(slot)
                self._release(reply.call_id)
            return
        answer.set_result(reply)

    async def infer(
        self, model: str, inputs: dict[str, np.ndarray], version: int | None = None
    ) -> dict[str, np.ndarray]:
        outputs, _ = await self.call(model, inputs, version)
        return outputs

    def infer_sync(
        self, model: str, inputs: dict[str, np.ndarray], version: int | None = None
    ) -> dict[str, np.ndarray]:
        outputs, _ = self.call_sync(model, inputs, version)
        return outputs

    async def call(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        version: int | None = None,
        parameters: str = "{}",
        timeout_us: int = 0,
    ) -> tuple[dict[str, np.ndarray], str]:
        """``infer`` with the request's parameters (a JSON object's text) and timeout;
        the outputs and the response's parameters."""
        if self._loop is None:  # a sync instance: nothing else runs while it waits
            return self.call_sync(model, inputs, version, parameters, timeout_us)
        if asyncio.get_running_loop() is not self._loop:
            raise ModelCallError(
                f"model '{self._model}': context.infer is awaited in execute itself, on the "
                "instance's event loop (not in a thread or a loop of the model's own)"
            )
        call_id = self._send(model, inputs, version, False, parameters, timeout_us)
        answer = self._loop.create_future()
        self._answers[call_id] = answer
        # Cancelled meanwhile, the answer still comes: deliver frees the slot then (the
        # front writes into it until it answers).
        reply = await answer
        return self._take(call_id, model, reply)

    def call_sync(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        version: int | None = None,
        parameters: str = "{}",
        timeout_us: int = 0,
    ) -> tuple[dict[str, np.ndarray], str]:
        if self._loop is not None:
            raise ModelCallError(
                f"model '{self._model}': infer_sync would stop every batch of this async "
                "instance. Hint: await context.infer(...) in an async execute"
            )
        # From execute itself (the main thread) the instance serves batches nested while
        # it waits; from a thread of the model's own it just waits.
        nested = threading.current_thread() is threading.main_thread()
        call_id = self._send(model, inputs, version, nested, parameters, timeout_us)
        return self._take(call_id, model, self._channel.wait_call(call_id))

    def control(self, action: str, model: str, version: str = "", body: bytes = b"") -> str:
        """A request to control the repository (``ModelControl``), blocking until it is
        answered from any thread (also an async instance's loop: it is rare and short
        next to what it waits for); the answer's parameters, e.g. ``{"ready": true}``."""
        self._check_process()
        call_id = next(self._ids)
        self._channel.expect(call_id)
        self._channel.send(ModelControl(call_id, action, model, version, body))
        reply = self._channel.wait_call(call_id)
        if reply is None:
            raise ModelCallError(f"{action} '{model}': the server went away")
        if isinstance(reply, CallFailure):
            raise ModelCallError(reply.message, reply.kind)
        return reply.parameters

    def _send(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        version: int | None,
        nested: bool,
        parameters: str,
        timeout_us: int,
        decoupled: bool = False,
    ) -> int:
        self._check_process()
        slot = self._free.pop() if self._free else Slot.create(f"reposerve-call-{self._model}")
        try:
            refs = self._write(slot, model, inputs)
        except Exception:  # the model's inputs (its error to see); the slot stays pooled
            self._free.append(slot)
            raise
        call_id = next(self._ids)
        self._slots[call_id] = slot
        if self._loop is None or decoupled:  # answers for wait_call
            self._channel.expect(call_id)
        number = -1 if version is None else version
        self._channel.send(
            Call(
                call_id,
                slot.fd,
                slot.size,
                model,
                number,
                refs,
                nested,
                parameters,
                timeout_us,
                decoupled,
                CALL_DEPTH.get() + 1,
            )
        )
        return call_id

    def _write(self, slot: Slot, model: str, inputs: dict[str, np.ndarray]) -> list[TensorRef]:
        """The inputs in the slot, in the wire layout, one after another."""
        refs: list[TensorRef] = []
        payloads: list[bytes | memoryview] = []
        offset = 0
        for name, value in inputs.items():
            array = np.asarray(value)
            datatype = _DATATYPES.get(array.dtype.newbyteorder("<")) or (
                "BYTES" if array.dtype.kind in "OSU" else None
            )
            if datatype is None:
                raise ModelCallError(
                    f"model '{self._model}': calling '{model}': input '{name}' has dtype "
                    f"{array.dtype}, which no V2 datatype carries"
                )
            payload = to_wire(datatype, array.astype(NUMPY_DTYPES[datatype], copy=False))
            refs.append(TensorRef(name, datatype, tuple(array.shape), offset, len(payload)))
            payloads.append(payload)
            offset = align(offset + len(payload))
        slot.ensure(offset)
        for ref, payload in zip(refs, payloads, strict=True):
            slot.buffer[ref.offset : ref.offset + ref.nbytes] = payload
        return refs

    def _take(
        self, call_id: int, model: str, reply: Reply | None
    ) -> tuple[dict[str, np.ndarray], str]:
        """The outputs, copied out of the slot (which is free again), and the response's
        parameters."""
        slot = self._slots.pop(call_id)
        if reply is not None:
            self._release(call_id)
        try:
            if reply is None:
                raise ModelCallError(f"calling '{model}': the server went away")
            if isinstance(reply, CallFailure):
                raise ModelCallError(reply.message, reply.kind)
            return _read(slot, reply), reply.parameters
        finally:
            self._pool(slot)

    def stream_sync(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        version: int | None = None,
        parameters: str = "{}",
        timeout_us: int = 0,
    ) -> CallStream:
        """A call taking its answers as a stream (Triton's ``exec(decoupled=True)``): each
        response's outputs and parameters as it comes (blocking until then, from any
        thread); a decoupled callee's end as an empty last one, another model's one
        answer alone. Left before its end, the call is still read to its end, so the
        callee and the slot are released."""
        nested = self._loop is None and threading.current_thread() is threading.main_thread()
        call_id = self._send(model, inputs, version, nested, parameters, timeout_us, True)
        return CallStream(call_id, self._responses(call_id, model), self._channel)

    async def stream(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        version: int | None = None,
        parameters: str = "{}",
        timeout_us: int = 0,
    ) -> CallStream:
        """``stream_sync`` awaited on an async instance's loop (Triton's
        ``await async_exec(decoupled=True)``): returns once the first answer has come,
        the loop running other batches meanwhile, so that calls of concurrent executes
        overlap. Taking the answers after the first blocks, as Triton's iterator does."""
        if self._loop is None:  # a sync instance: nothing else runs while it waits
            return self.stream_sync(model, inputs, version, parameters, timeout_us)
        loop = self._loop
        call_id = self._send(model, inputs, version, False, parameters, timeout_us, True)
        answered = loop.create_future()

        def wake() -> None:
            if not answered.done():
                answered.set_result(None)

        self._channel.when_answered(call_id, lambda: loop.call_soon_threadsafe(wake))
        try:
            await answered
        except asyncio.CancelledError:
            # Its caller has gone: cancel the callee, and take the answers it still sends
            # on a thread, so the slot is freed without the loop waiting for them.
            self._channel.send(CallCancel(call_id))
            threading.Thread(
                target=self._drain, args=(call_id,), name="reposerve-call-drain", daemon=True
            ).start()
            raise
        return CallStream(call_id, self._responses(call_id, model), self._channel)

    def _responses(
        self, call_id: int, model: str
    ) -> Generator[tuple[dict[str, np.ndarray], str], None, None]:
        slot = self._slots[call_id]
        ended = False
        try:
            while True:
                reply = self._channel.wait_call(call_id)
                if not isinstance(reply, CallResponse):
                    ended = True
                    # The end: the last response (no outputs: an empty final one), another
                    # model's one answer, or the call's error.
                    yield self._take(call_id, model, reply)
                    return
                outputs = _read(slot, reply)
                self._channel.send(CallNext(call_id))
                yield outputs, reply.parameters
        finally:
            if not ended:
                self._drain(call_id)

    def _drain(self, call_id: int) -> None:
        """Take what a stream's callee still sends, to its end; then its slot is free."""
        while True:
            reply = self._channel.wait_call(call_id)
            if isinstance(reply, CallResponse):
                self._channel.send(CallNext(call_id))
                continue
            self._pool(self._slots.pop(call_id))
            if reply is not None:
                self._release(call_id)
            return

    def _pool(self, slot: Slot) -> None:
        """``slot`` is free again. With no call under way the pool shrinks to
        KEEP_CALL_SLOTS: a burst of calls (a deep recursion, many at once) grew it, and
        each slot holds descriptors here and in the front, which is told first."""
        self._free.append(slot)
        while not self._slots and len(self._free) > KEEP_CALL_SLOTS:
            try:
                extra = self._free.pop(0)
            except IndexError:  # another thread took it meanwhile
                return
            self._channel.send(CallSlotClosed(extra.fd))
            extra.close()

    def _check_process(self) -> None:
        """A forked child of the instance would share its socket with the instance and
        read answers meant for it (both would hang): refused at once instead."""
        if os.getpid() != self._pid:
            raise ModelCallError(
                f"model '{self._model}': model calls from a process forked by the model are "
                "not supported. Hint: call from the instance process (execute, or a thread)"
            )

    def _release(self, call_id: int) -> None:
        """The front's room for this call ends: its caller runs on (or is gone)."""
        self._channel.send(CallTaken(call_id))


def _read(slot: Slot, reply: CallResult | CallResponse) -> dict[str, np.ndarray]:
    """An answer's outputs, copied out of the call slot."""
    slot.remap(reply.slot_size)
    view = memoryview(slot.buffer)
    outputs = {}
    for ref in reply.outputs:
        array = to_numpy(ref.datatype, ref.shape, view[ref.offset : ref.offset + ref.nbytes])
        outputs[ref.name] = array if ref.datatype == "BYTES" else array.copy()
    return outputs


class CallStream:
    """The answers of a call taken as a stream, as they come; ``cancel()`` asks the front
    to cancel the callee's request (the stream then ends, with CANCELLED unless the
    callee had finished)."""

    def __init__(
        self,
        call_id: int,
        responses: Generator[tuple[dict[str, np.ndarray], str], None, None],
        channel: CallChannel,
    ) -> None:
        self._call_id = call_id
        self._responses = responses
        self._channel = channel

    def __iter__(self) -> CallStream:
        return self

    def __next__(self) -> tuple[dict[str, np.ndarray], str]:
        return next(self._responses)

    def cancel(self) -> None:
        self._channel.send(CallCancel(self._call_id))

    def close(self) -> None:
        self._responses.close()
