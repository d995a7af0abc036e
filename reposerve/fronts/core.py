"""The core's end of one front process's socket: the front's calls run on the service
here, as the server's own front's would, and their answers go back into the front's slots.

A request's bytes are read straight out of the front's slot (the body of an HTTP request,
decoded here against the model's current config, so a front never acts on a stale one;
the tensors of a gRPC request); the answers are copied into the same slot, after them,
and the front encodes them from there. A stream's answers queue in the slot, a few at a
time: beyond ``COPY_AHEAD`` (or a full slot) the next waits until the front has taken
those before it, which holds back the instance as a slow client does in one process.
When the front's socket closes (the process died), its calls are cancelled: requests it
had queued leave the queues, and the batches they shared with other fronts go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from reposerve.answers import Answer, Answers
from reposerve.errors import ErrorKind, ReposerveError
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
    Operate,
    OutputRef,
    Returned,
    SlotOpened,
    Started,
    Taken,
    ToFront,
)
from reposerve.instance.arena import Slot, align
from reposerve.scheduler.lease import COPY_AHEAD
from reposerve.service import InferenceService

log = logging.getLogger("reposerve.fronts")

_encoder = msgspec.msgpack.Encoder()


class FrontPeer(asyncio.Protocol):
    def __init__(
        self, service: InferenceService, label: str, pid: int, on_lost: Callable[[], None]
    ) -> None:
        self._service = service
        self.label = label  # "front 2 (pid 1234)", for the log
        self._pid = pid
        self._on_lost = on_lost
        self._reader = FrameReader(FromFront)
        self._transport: asyncio.Transport | None = None
        self._slots: dict[int, Slot] = {}
        self._calls: dict[int, asyncio.Task] = {}
        self._windows: dict[int, _Window] = {}
        self.served = 0  # calls taken, since the front started

    # -- the socket ----------------------------------------------------------------------

    # typeshed types any protocol's transport as a BaseTransport; a stream's is a Transport
    # (uvicorn's own connection_made says so the same way), and uvloop's is no subclass of
    # asyncio.Transport for isinstance to find
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._transport = transport
        self._outgoing = Outgoing(transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except msgspec.DecodeError:
            log.exception("%s sent a frame that does not decode: closing its socket", self.label)
            self.close()
            return
        for frame in frames:
            self._receive(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        for task in list(self._calls.values()):
            task.cancel()  # its requests leave the queues
        for slot in self._slots.values():
            slot.close()  # the mappings live on while the cancelled calls hold views
        self._slots.clear()
        self._on_lost()

    def send(self, message: ToFront) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._outgoing.send(encode(message))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    @property
    def calls(self) -> int:
        """The calls running now."""
        return len(self._calls)

    # -- the calls -----------------------------------------------------------------------

    def _receive(self, frame: FromFront) -> None:
        match frame:
            case Infer() | InferParts(stream=False):
                self._start(frame.call, self._answer(frame))
            case InferParts() | Generate():
                self._start(frame.call, self._stream(frame))
            case Operate():
                self._start(frame.call, self._operate(frame))
            case Taken(call=call):
                window = self._windows.get(call)
                if window is not None:
                    window.taken()
            case Cancel(call=call):
                task = self._calls.get(call)
                if task is not None:
                    task.cancel()
            case SlotOpened(slot=index, fd=fd, size=size):
                try:
                    self._slots[index] = Slot.open_shared(f"/proc/{self._pid}/fd/{fd}", size)
                except OSError:
                    log.exception("%s: its slot %d could not be opened", self.label, index)
                    self.close()

    def _start(self, call: int, work: Coroutine[Any, Any, None]) -> None:
        self.served += 1
        task = asyncio.get_running_loop().create_task(work)
        self._calls[call] = task
        task.add_done_callback(functools.partial(self._ended, call))

    def _ended(self, call: int, task: asyncio.Task) -> None:
        """The call's last frame, unless its work sent it: its error, or its cancel
        (which may come before the work took a step)."""
        del self._calls[call]
        if task.cancelled():
            self.send(Failed(call, "the request was cancelled", ErrorKind.CANCELLED.value))
            return
        error = task.exception()
        if isinstance(error, ReposerveError):
            self.send(Failed(call, error.message, error.kind.value, type(error).__name__))
        elif error is not None:  # the client gets its error, the log the traceback
            log.error("%s: unhandled error", self.label, exc_info=error)
            self.send(Failed(call, f"internal error: {error!r}", ErrorKind.INTERNAL.value))

    def _slot(self, index: int, size: int) -> Slot:
        slot = self._slots.get(index)
        if slot is None:
            raise ReposerveError(f"{self.label}: no slot {index}")
        if size > slot.size:  # the front grew it for this request
            slot.remap(size)
        return slot

    async def _answer(self, frame: Infer | InferParts) -> None:
        slot = self._slot(frame.slot, frame.slot_size)
        view = memoryview(slot.buffer)
        if isinstance(frame, Infer):
            body = view[: frame.nbytes]
            answer = await self._service.infer(
                frame.model, frame.version, body, frame.header_length
            )
            start = frame.nbytes
        else:
            header, raws, start = _parts(frame, view)
            answer = await self._service.infer_parts(frame.model, frame.version, header, raws)
        with answer:
            message, _ = _answered(frame.call, slot, align(start), answer, last=True)
        self.send(message)

    async def _stream(self, frame: InferParts | Generate) -> None:
        slot = self._slot(frame.slot, frame.slot_size)
        view = memoryview(slot.buffer)
        answers: Answers
        if isinstance(frame, Generate):
            body = bytes(view[: frame.nbytes])  # its decoder searches the bytes
            answers = await self._service.generate(frame.model, frame.version, body)
            start = frame.nbytes
        else:
            header, raws, start = _parts(frame, view)
            answers = await self._service.stream_parts(frame.model, frame.version, header, raws)
        self.send(Started(frame.call))
        window = self._windows[frame.call] = _Window(align(start))
        try:
            async with contextlib.aclosing(answers):
                async for answer in answers:
                    with answer:
                        cursor = await window.room(answer, slot.size)
                        message, end = _answered(frame.call, slot, cursor, answer, last=False)
                        window.put(end)
                    self.send(message)
        finally:
            del self._windows[frame.call]
        self.send(Ended(frame.call))

    async def _operate(self, frame: Operate) -> None:
        value = await self._service.perform(frame.operation)
        self.send(Returned(frame.call, _encoder.encode(value)))


class _Window:
    """Where a stream's next answer goes in its slot, and how many the front has yet to
    take."""

    def __init__(self, base: int) -> None:
        self._base = base
        self._cursor = base
        self._waiting = 0  # answers sent, not yet taken
        self._drained: asyncio.Future[None] | None = None

    async def room(self, answer: Answer, size: int) -> int:
        """The offset to write ``answer`` at, once the front has taken enough of those
        before it."""
        needed = sum(align(len(tensor.raw)) for _, tensor, _ in answer.outputs)
        if self._waiting and (self._waiting >= COPY_AHEAD or self._cursor + needed > size):
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        if not self._waiting:
            self._cursor = self._base
        return self._cursor

    def put(self, end: int) -> None:
        self._cursor = end
        self._waiting += 1

    def taken(self) -> None:
        self._waiting -= 1
        if not self._waiting and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)


def _parts(frame: InferParts, view: memoryview) -> tuple[dict[str, Any], list[memoryview], int]:
    """An InferParts' header, its inputs' views on the slot, and where they end."""
    try:
        header = msgspec.msgpack.decode(frame.header, type=dict[str, Any])
    except msgspec.DecodeError as exc:
        raise ReposerveError(f"model '{frame.model}': request header: {exc}") from exc
    raws = [view[offset : offset + nbytes] for offset, nbytes in frame.spans]
    end = max((offset + nbytes for offset, nbytes in frame.spans), default=0)
    return header, raws, end


def _answered(
    call: int, slot: Slot, offset: int, answer: Answer, last: bool
) -> tuple[Answered, int]:
    """``answer``'s outputs copied into ``slot`` from ``offset`` (grown to hold them), as
    the frame that says where; and where they end."""
    slot.ensure(offset + sum(align(len(tensor.raw)) for _, tensor, _ in answer.outputs))
    buffer = slot.buffer
    refs = []
    for name, tensor, binary in answer.outputs:
        nbytes = len(tensor.raw)
        buffer[offset : offset + nbytes] = tensor.memory()
        refs.append(OutputRef(name, tensor.datatype, tensor.shape, offset, nbytes, binary))
        offset = align(offset + nbytes)
    message = Answered(
        call,
        answer.version,
        answer.request_id,
        refs,
        answer.parameters,
        answer.final,
        slot.size,
        last,
        answer.shared_outputs,
    )
    return message, offset
