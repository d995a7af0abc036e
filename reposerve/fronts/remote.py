"""The service as a front process sees it: every operation is a call to the core over
the front's socket (``reposerve.fronts.core`` serves it), and a request's bytes and its
answers cross in one of this front's slots (``reposerve.fronts.frames``).

A call holds its slot until its last frame has come and every answer made from it has
been released (the front encodes straight out of the slot); then the slot serves the
next call. A caller that gives up (a client that left) cancels the call in the core;
the slot still waits for the call's last frame, so the core never writes into a slot
that another call has taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from reposerve.answers import Answer, Answers
from reposerve.errors import (
    ConfigError,
    ErrorKind,
    InstanceError,
    InvalidInput,
    ModelCallError,
    ModelError,
    ProtocolError,
    ReposerveError,
    RepositoryError,
    SchedulerError,
    SharedMemoryError,
)
from reposerve.framing import FrameReader, Outgoing, encode
from reposerve.fronts.frames import (
    Answered,
    Cancel,
    Ended,
    Failed,
    FromFront,
    Generate,
    Infer,
    InferParts,
    Leave,
    Operate,
    Returned,
    SlotOpened,
    Started,
    Taken,
    ToFront,
)
from reposerve.instance.arena import Slot, align, grown_size
from reposerve.operations import AnyOperation, Operation, result_type
from reposerve.protocol.request import Body, Raw
from reposerve.scheduler.stream import Stream
from reposerve.tensor import Tensor

log = logging.getLogger("reposerve.fronts")

_header_encoder = msgspec.msgpack.Encoder()

R = TypeVar("R")


# The errors a front may meet, by class name (Failed.error): it raises what the server did.
_ERRORS: dict[str, type[ReposerveError]] = {
    kind.__name__: kind
    for kind in (
        ReposerveError,
        ConfigError,
        ProtocolError,
        RepositoryError,
        SchedulerError,
        InstanceError,
        InvalidInput,
        ModelCallError,
        ModelError,
        SharedMemoryError,
    )
}


def _error(frame: Failed) -> ReposerveError:
    return _ERRORS.get(frame.error, ReposerveError)(frame.message, ErrorKind(frame.kind))


class _Call:
    """One call's frames as they come, and what holds its slot: its caller, until it
    has made an answer of the first frame or given up, and each answer made."""

    __slots__ = ("id", "slot", "frames", "held", "over", "_done")

    def __init__(self, call_id: int, slot: int | None, done: Callable[[_Call], None]) -> None:
        self.id = call_id
        self.slot = slot
        self.frames: Stream[ToFront] = Stream()
        self.held = 1  # the caller's claim
        self.over = False  # its last frame has come
        self._done = done

    def arrived(self, frame: ToFront, last: bool) -> None:
        self.frames.put(frame)
        if last:
            self.over = True
            self.frames.end()
            self._settle()

    def released(self) -> None:
        self.held -= 1
        self._settle()

    def abandon(self) -> None:
        """The call could not be sent: over, and the caller's claim given up."""
        self.over = True
        self.frames.end()
        self.released()

    def _settle(self) -> None:
        if self.over and not self.held:
            self._done(self)


class _Hold:
    """An answer's claim on its call's slot (``Answer.release`` ends it): a streamed one
    tells the core the space may be written again."""

    __slots__ = ("_call", "_taken")

    def __init__(self, call: _Call, taken: Callable[[], None] | None) -> None:
        self._call: _Call | None = call
        self._taken = taken

    def release(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            if self._taken is not None:
                self._taken()
            call.released()


class _Answers:
    """A stream's answers as they come. Closed (or dropped) before its end, it cancels
    the call in the core; either way it gives up the caller's claim once."""

    def __init__(self, service: RemoteService, call: _Call, slot: Slot) -> None:
        self._service = service
        self._call = call
        self._slot = slot
        loop = asyncio.get_running_loop()
        self._closer = weakref.finalize(self, _let_go_soon, loop, service, call)

    def __aiter__(self) -> _Answers:
        return self

    async def __anext__(self) -> Answer:
        async for frame in self._call.frames:
            if isinstance(frame, Failed):
                self._closer()
                raise _error(frame)
            if isinstance(frame, Answered):
                self._call.held += 1
                return self._service.answer(self._call, frame, self._slot, streamed=True)
        self._closer()  # the end: the caller's claim goes now, not when this is dropped
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self._closer()


def _let_go_soon(loop: asyncio.AbstractEventLoop, service: RemoteService, call: _Call) -> None:
    """``service.let_go(call)`` on its loop: a dropped stream may be collected on any
    thread, or after the loop closed (then there is nothing left to tell)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(service.let_go, call)


class RemoteService(asyncio.Protocol):
    """``FrontService`` over the socket to the core."""

    def __init__(self, name: str, on_leave: Callable[[], None]) -> None:
        self._name = name  # the slots' name prefix
        self._on_leave = on_leave  # the core asks this front to leave (or is gone)
        self._reader = FrameReader(ToFront)
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, _Call] = {}
        self._next_call = 0
        self._slots: list[Slot] = []
        self._free: list[int] = []

    # -- the socket ----------------------------------------------------------------------

    # typeshed types any protocol's transport as a BaseTransport; a stream's is a Transport
    # (uvicorn's own connection_made says so the same way), and uvloop's is no subclass of
    # asyncio.Transport for isinstance to find
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._transport = transport
        self._outgoing = Outgoing(transport)

    def data_received(self, data: bytes) -> None:
        for frame in self._reader.feed(data):
            match frame:
                case Leave():
                    self._on_leave()
                case Answered(last=last):
                    self._arrived(frame, last)
                case Started() | Returned():
                    self._arrived(frame, isinstance(frame, Returned))
                case Failed() | Ended():
                    self._arrived(frame, True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        gone = Failed(0, "the server is shutting down", ErrorKind.UNAVAILABLE.value)
        for call in list(self._calls.values()):
            call.arrived(gone, True)
        self._on_leave()

    def _arrived(self, frame: Started | Answered | Failed | Ended | Returned, last: bool) -> None:
        call = self._calls.get(frame.call)
        if call is not None:
            call.arrived(frame, last)

    def _send(self, message: FromFront) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ReposerveError("the server is shutting down", ErrorKind.UNAVAILABLE)
        self._outgoing.send(encode(message))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- calls and slots -----------------------------------------------------------------

    def _open(self) -> _Call:
        """A new call that holds no slot (an operation)."""
        self._next_call += 1
        call = _Call(self._next_call, None, self._finish)
        self._calls[call.id] = call
        return call

    def _open_slot(self, needed: int) -> tuple[_Call, int, Slot]:
        """A new call with a slot of at least ``needed`` bytes: the call, the slot's index
        and the slot."""
        self._next_call += 1
        index = self._take_slot(needed)
        call = _Call(self._next_call, index, self._finish)
        self._calls[call.id] = call
        return call, index, self._slots[index]

    def _begin(self, call: _Call, message: FromFront) -> None:
        """Send the frame that opens ``call``; a link that is gone ends the call here."""
        try:
            self._send(message)
        except ReposerveError:
            call.abandon()
            raise

    def _finish(self, call: _Call) -> None:
        del self._calls[call.id]
        if call.slot is not None:
            self._free.append(call.slot)

    def _take_slot(self, needed: int) -> int:
        if self._free:
            index = self._free.pop()
            try:
                self._slots[index].ensure(needed)
            except OSError:
                self._free.append(index)
                raise
            return index
        slot = Slot.create(f"{self._name}-{len(self._slots)}", grown_size(needed))
        self._slots.append(slot)
        index = len(self._slots) - 1
        try:
            self._send(SlotOpened(index, slot.fd, slot.size))
        except ReposerveError:
            self._free.append(index)
            raise
        return index

    async def _first(self, call: _Call) -> ToFront:
        """The call's first frame; a caller that gives up cancels the call."""
        try:
            frame = await anext(call.frames)
        except BaseException:
            self.let_go(call)
            raise
        if isinstance(frame, Failed):
            call.released()
            raise _error(frame)
        return frame

    def let_go(self, call: _Call) -> None:
        """The caller gives up its claim; the call is cancelled unless it is over."""
        if not call.over and self._transport is not None and not self._transport.is_closing():
            self._outgoing.send(encode(Cancel(call.id)))
        call.released()

    def answer(self, call: _Call, frame: Answered, slot: Slot, streamed: bool) -> Answer:
        """The answer ``frame`` says, holding one of ``call``'s claims."""
        if frame.slot_size > slot.size:  # the core grew it for the answer
            slot.remap(frame.slot_size)
        view = memoryview(slot.buffer)
        outputs = [
            (
                ref.name,
                Tensor(ref.datatype, ref.shape, view[ref.offset : ref.offset + ref.nbytes]),
                ref.binary,
            )
            for ref in frame.outputs
        ]
        taken = (lambda: self._taken(call)) if streamed else None
        return Answer(
            outputs,
            frame.parameters,
            frame.final,
            frame.version,
            frame.request_id,
            _Hold(call, taken),
            frame.shared_outputs,
        )

    def _taken(self, call: _Call) -> None:
        if not call.over and self._transport is not None:
            self._outgoing.send(encode(Taken(call.id)))

    # -- inference -----------------------------------------------------------------------

    async def infer(
        self, name: str, version: str | None, body: Body, header_length: int | None
    ) -> Answer:
        call, index, slot = self._open_slot(len(body))
        slot.buffer[: len(body)] = body
        self._begin(call, Infer(call.id, name, version, index, slot.size, len(body), header_length))
        frame = await self._first(call)
        assert isinstance(frame, Answered)
        return self.answer(call, frame, slot, streamed=False)

    async def infer_parts(
        self, name: str, version: str | None, header: dict[str, Any], raws: Sequence[Raw]
    ) -> Answer:
        call, slot = self._parts(name, version, header, raws, stream=False)
        frame = await self._first(call)
        assert isinstance(frame, Answered)
        return self.answer(call, frame, slot, streamed=False)

    async def generate(self, name: str, version: str | None, body: bytes | bytearray) -> Answers:
        call, index, slot = self._open_slot(len(body))
        slot.buffer[: len(body)] = body
        self._begin(call, Generate(call.id, name, version, index, slot.size, len(body)))
        await self._first(call)  # Started: the request was decoded and taken
        return _Answers(self, call, slot)

    async def stream_parts(
        self, name: str, version: str | None, header: dict[str, Any], raws: Sequence[Raw]
    ) -> Answers:
        call, slot = self._parts(name, version, header, raws, stream=True)
        await self._first(call)
        return _Answers(self, call, slot)

    def _parts(
        self,
        name: str,
        version: str | None,
        header: dict[str, Any],
        raws: Sequence[Raw],
        stream: bool,
    ) -> tuple[_Call, Slot]:
        spans = []
        offset = 0
        for raw in raws:
            spans.append((offset, len(raw)))
            offset = align(offset + len(raw))
        call, index, slot = self._open_slot(offset)
        buffer = slot.buffer
        for (start, nbytes), raw in zip(spans, raws, strict=True):
            buffer[start : start + nbytes] = raw
        encoded = _header_encoder.encode(header)
        frame = InferParts(call.id, name, version, encoded, index, slot.size, spans, stream)
        self._begin(call, frame)
        return call, slot

    # -- the other operations ------------------------------------------------------------

    async def perform(self, operation: Operation[R]) -> R:
        if not isinstance(operation, AnyOperation):  # the frame could not carry it
            raise TypeError(f"{type(operation).__name__} is missing from AnyOperation")
        call = self._open()
        self._begin(call, Operate(call.id, operation))
        frame = await self._first(call)
        call.released()
        assert isinstance(frame, Returned)
        return msgspec.msgpack.decode(frame.value, type=result_type(type(operation)))
