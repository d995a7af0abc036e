"""A front's link to the server, both ends in one process over a real socket pair and real
memfd slots: ``RemoteService`` (the front's side) against ``FrontPeer`` (the server's),
which serves a stand-in for the service's inference and other operations."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from reposerve.answers import Answer
from reposerve.errors import ErrorKind, InstanceError, ReposerveError
from reposerve.framing import FrameReader, encode
from reposerve.fronts.core import FrontPeer
from reposerve.fronts.frames import Cancel, Failed, Infer, SlotOpened, ToFront
from reposerve.fronts.remote import RemoteService
from reposerve.instance.arena import Slot
from reposerve.operations import IndexEntry, IndexRequest, LoadRequest, Operation
from reposerve.tensor import Tensor

pytestmark = pytest.mark.integration


class _Released:
    def __init__(self) -> None:
        self.count = 0

    def release(self) -> None:
        self.count += 1


class _Service:
    """Inference that answers the body's bytes reversed (or waits for good on b"hang"),
    streams that answer ``count`` times, and an index of the models ``loaded``."""

    def __init__(self) -> None:
        self.released = _Released()
        self.started = asyncio.Event()
        self.loaded: list[str] = []

    async def perform(self, operation: Operation[Any]) -> object:
        match operation:
            case IndexRequest():
                return [IndexEntry(name, "1", "READY") for name in self.loaded]
            case LoadRequest(name="missing"):
                raise ReposerveError("failed to load 'missing'", ErrorKind.INVALID_ARGUMENT)
            case LoadRequest(name=name):
                self.loaded.append(name)
                return None
        raise AssertionError(f"not performed here: {operation!r}")

    def _answer(self, raw: bytes, final: bool = True) -> Answer:
        tensor = Tensor("UINT8", (len(raw),), memoryview(raw[::-1]))
        return Answer([("OUT", tensor, True)], {"p": 1}, final, "1", "id", self.released)

    async def infer(self, name: str, version: Any, body: Any, header_length: Any) -> Answer:
        data = bytes(body)
        if name == "missing":
            raise ReposerveError(f"model '{name}' is not known", ErrorKind.NOT_FOUND)
        if name == "failing":  # the model's failure, not the request's
            raise InstanceError(f"model '{name}' failed: boom")
        if data == b"hang":
            self.started.set()
            await asyncio.Event().wait()
        return self._answer(data)

    async def generate(self, name: str, version: Any, body: bytes) -> AsyncIterator[Answer]:
        async def answers() -> AsyncIterator[Answer]:
            for index in range(int(body)):
                yield self._answer(b"%d" % index * 40_000, final=False)

        return answers()


async def _closed(remote: RemoteService, peer: FrontPeer) -> None:
    remote.close()
    peer.close()
    await asyncio.sleep(0.01)  # both transports see their end


async def _linked() -> tuple[RemoteService, FrontPeer, _Service]:
    """Both ends, on a socket pair, in this process (the peer maps slots by our pid)."""
    ours, theirs = socket.socketpair()
    service = _Service()
    loop = asyncio.get_running_loop()
    remote = RemoteService("test-front", lambda: None)
    _, peer = await loop.connect_accepted_socket(
        lambda: FrontPeer(service, "front 1", os.getpid(), lambda: None),  # type: ignore[arg-type]
        ours,
    )
    await loop.connect_accepted_socket(lambda: remote, theirs)
    return remote, peer, service


def test_an_answer_comes_back_through_the_callers_slot_and_frees_it():
    async def scenario() -> None:
        remote, peer, service = await _linked()
        for body in (b"abc", b"x" * 3_000_000):  # the second outgrows the first slot
            with await remote.infer("m", None, body, None) as answer:
                [(name, tensor, binary)] = answer.outputs
                assert (name, bytes(tensor.raw), binary) == ("OUT", body[::-1], True)
                assert (answer.parameters, answer.version, answer.request_id) == (
                    {"p": 1},
                    "1",
                    "id",
                )
        assert service.released.count == 2  # the server let go of each lease
        assert len(remote._slots) == 1 and remote._free == [0]  # one slot, reused, free
        assert peer.calls == 0
        await _closed(remote, peer)

    asyncio.run(scenario())


def test_an_error_is_the_servers_own_and_costs_no_slot():
    async def scenario() -> None:
        remote, peer, _ = await _linked()
        with pytest.raises(ReposerveError) as raised:
            await remote.infer("missing", None, b"abc", None)
        assert raised.value.kind is ErrorKind.NOT_FOUND
        assert "model 'missing' is not known" in raised.value.message
        with pytest.raises(InstanceError) as failed:  # the same class: fronts tell them apart
            await remote.infer("failing", None, b"abc", None)
        assert (failed.value.message, failed.value.kind) == (
            "model 'failing' failed: boom",
            ErrorKind.INTERNAL,
        )
        assert remote._free == [0] and not remote._calls
        await _closed(remote, peer)

    asyncio.run(scenario())


def test_an_operation_crosses_as_its_value_and_its_result_comes_back_typed():
    async def scenario() -> None:
        remote, peer, service = await _linked()
        assert await remote.perform(LoadRequest("m", files={"1/model.py": b"\xff"})) is None
        assert await remote.perform(IndexRequest(ready=True)) == [IndexEntry("m", "1", "READY")]
        with pytest.raises(ReposerveError) as raised:
            await remote.perform(LoadRequest("missing"))
        assert (raised.value.message, raised.value.kind) == (
            "failed to load 'missing'",
            ErrorKind.INVALID_ARGUMENT,
        )
        assert service.loaded == ["m"]
        assert not remote._calls and not remote._slots  # an operation takes no slot
        await _closed(remote, peer)

    asyncio.run(scenario())


def test_a_caller_that_leaves_cancels_the_call_and_its_slot_waits_for_the_last_frame():
    async def scenario() -> None:
        remote, peer, service = await _linked()
        waiting = asyncio.ensure_future(remote.infer("m", None, b"hang", None))
        await service.started.wait()
        assert peer.calls == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(50):
            if not remote._calls:
                break
            await asyncio.sleep(0.01)
        assert peer.calls == 0 and not remote._calls and remote._free == [0]
        await _closed(remote, peer)

    asyncio.run(scenario())


def test_a_stream_is_taken_a_few_answers_at_a_time():
    async def scenario() -> None:
        remote, peer, _ = await _linked()
        answers = await remote.generate("m", None, b"12")
        seen = []
        async for answer in answers:
            with answer:
                seen.append(bytes(answer.outputs[0][1].raw)[:2])
                await asyncio.sleep(0)  # the server may run ahead of us, a few at most
        assert seen == [(b"%d" % i * 2)[::-1][:2] for i in range(12)]
        for _ in range(50):
            if not remote._calls:
                break
            await asyncio.sleep(0.01)
        assert not remote._calls and remote._free == [0] and peer.calls == 0
        await _closed(remote, peer)

    asyncio.run(scenario())


def test_a_call_cancelled_in_the_read_that_opened_it_still_gets_its_last_frame():
    """Infer and its Cancel arrive in one read: the call's task is cancelled before its
    first step, and the front must still hear that the call is over."""

    async def scenario() -> None:
        ours, theirs = socket.socketpair()
        service = _Service()
        loop = asyncio.get_running_loop()
        _, peer = await loop.connect_accepted_socket(
            lambda: FrontPeer(service, "front 1", os.getpid(), lambda: None),  # type: ignore[arg-type]
            ours,
        )
        slot = Slot.create("test-slot")
        slot.buffer[:4] = b"hang"
        theirs.sendall(
            encode(SlotOpened(0, slot.fd, slot.size))
            + encode(Infer(1, "m", None, 0, slot.size, 4, None))
            + encode(Cancel(1))
        )
        theirs.setblocking(False)
        reader = FrameReader(ToFront)
        frames: list = []
        for _ in range(100):
            await asyncio.sleep(0.01)
            with contextlib.suppress(BlockingIOError):
                frames += reader.feed(theirs.recv(65536))
            if frames:
                break
        assert frames == [Failed(1, "the request was cancelled", ErrorKind.CANCELLED.value)]
        assert peer.calls == 0
        assert not service.started.is_set()  # it never ran
        peer.close()
        theirs.close()
        slot.close()
        await asyncio.sleep(0.01)

    asyncio.run(scenario())


def test_a_slot_the_other_side_grew_is_mapped_as_it_is_never_cut():
    """The server grows a front's slot for a large answer the front never read: the
    front's next, smaller growth maps the file as it is (its seal refuses a shrink)."""
    front = Slot.create("test-grown")
    server = Slot.open_shared(f"/proc/{os.getpid()}/fd/{front.fd}", front.size)
    try:
        server.ensure(8 << 20)
        front.ensure(2 << 20)  # more than it mapped, less than the file holds
        assert front.size == server.size == os.fstat(front.fd).st_size == 8 << 20
    finally:
        server.close()
        front.close()
