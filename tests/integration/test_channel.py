"""The worker's end of its socket (``Channel``) over a socket pair, fed scripted frames by
the test as the front would send them: who gets which frame, in what order, with which
descriptor, and what every wait returns once the front has gone."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest

from reposerve.framing import FrameReader
from reposerve.instance.arena import Slot
from reposerve.instance.channel import Channel
from reposerve.instance.messages import (
    AddSlot,
    CallResult,
    Cancel,
    Execute,
    FromInstance,
    ReadyQuery,
    Result,
    Resume,
    ToInstance,
    encode_frame,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def pair() -> Iterator[tuple[Channel, socket.socket]]:
    """A channel and the front's end of its socket."""
    ours, theirs = socket.socketpair()
    ours.settimeout(30)  # a wait that never ends fails the test (as the front gone)
    theirs.settimeout(30)
    yield Channel(ours), theirs
    ours.close()
    theirs.close()


def _send(front: socket.socket, *messages: ToInstance) -> None:
    front.sendall(b"".join(encode_frame(message) for message in messages))


def _execute(batch_id: int) -> Execute:
    return Execute(batch_id, 0, 0, [])


def test_frames_come_in_order_and_a_slot_s_descriptor_beside_its_frame(pair):
    channel, front = pair
    slot = Slot.create("test-channel")
    try:
        socket.send_fds(front, [encode_frame(AddSlot(3, slot.size))], [slot.fd])
        _send(front, _execute(1), _execute(2))
        assert channel.receive() == AddSlot(3, slot.size)
        fd = channel.take_fd()
        try:
            assert os.fstat(fd).st_ino == os.fstat(slot.fd).st_ino
        finally:
            os.close(fd)
        assert [channel.receive(), channel.receive()] == [_execute(1), _execute(2)]
    finally:
        slot.close()


def test_a_stream_s_resume_or_cancel_is_taken_out_of_turn(pair):
    channel, front = pair
    _send(front, _execute(5), Resume(0), Cancel(4), Resume(4))
    assert channel.wait_resume(0) is True
    assert channel.wait_resume(4) is False  # its Cancel came first
    # The rest wait their turn, in order (the Resume of a cancelled stream too).
    assert [channel.receive(), channel.receive()] == [_execute(5), Resume(4)]


def test_a_call_s_answer_goes_to_its_caller_and_batches_meanwhile_run_nested(pair):
    channel, front = pair
    served: list[ToInstance] = []

    def serve(message: ToInstance) -> None:  # the call's answer needs this batch first
        served.append(message)
        _send(front, CallResult(7, 0, []), _execute(3))

    channel.serve = serve
    channel.expect(7)
    _send(front, _execute(1), Resume(0))
    # On the main thread the waiting model's instance runs the batch that came meanwhile;
    # what is not a batch waits its turn, and so does a batch that came after the answer.
    assert channel.wait_call(7) == CallResult(7, 0, [])
    assert served == [_execute(1)]
    assert [channel.receive(), channel.receive()] == [Resume(0), _execute(3)]


def test_a_model_s_own_thread_waits_for_its_answer_and_runs_no_batch(pair):
    channel, front = pair
    channel.serve = pytest.fail  # never on a thread of the model's own
    channel.expect(7)
    answers: list[object] = []
    waiter = threading.Thread(target=lambda: answers.append(channel.wait_call(7)))
    waiter.start()
    _send(front, _execute(1), CallResult(7, 0, []))
    waiter.join(30)
    assert answers == [CallResult(7, 0, [])]
    assert channel.receive() == _execute(1)


def test_whoever_reads_tells_a_waiting_loop_its_answer_has_come(pair):
    channel, front = pair
    channel.expect(9)
    told = threading.Event()
    channel.when_answered(9, told.set)
    _send(front, CallResult(9, 0, []), _execute(1))
    assert channel.receive() == _execute(1)  # reads the answer on its way
    assert told.is_set()
    assert channel.wait_call(9) == CallResult(9, 0, [])


def test_readiness_queries_go_to_the_thread_that_answers_them(pair):
    channel, front = pair
    _send(front, ReadyQuery(1), _execute(1), ReadyQuery(2))
    assert channel.receive() == _execute(1)
    assert [channel.wait_query(), channel.wait_query()] == [ReadyQuery(1), ReadyQuery(2)]


def test_every_wait_ends_once_the_front_has_gone(pair):
    channel, front = pair
    channel.expect(3)
    told = threading.Event()
    channel.when_answered(3, told.set)
    front.close()
    assert channel.receive() is None
    assert told.is_set()
    assert channel.wait_resume(0) is False
    assert channel.wait_call(3) is None
    assert channel.wait_query() is None


def test_what_the_instance_sends_reaches_the_front_whole(pair):
    channel, front = pair
    results = [Result(index, 0, [], index) for index in range(50)]
    senders = [threading.Thread(target=channel.send, args=(result,)) for result in results]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(30)
    reader = FrameReader(FromInstance)
    received: list[FromInstance] = []
    while len(received) < len(results):
        received += reader.feed(front.recv(1 << 16))
    assert sorted(received, key=lambda result: result.batch_id) == results  # type: ignore[union-attr]
