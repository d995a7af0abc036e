"""The instance process's end of its socket to the front: frames in (with the file
descriptors of new slots passed beside them), frames out.

Reads block, and any thread may be the one reading: the main thread between batches, or
while a sync model waits (for a decoupled batch's Resume, or a model call's answer), or
a thread of the model's own that waits for its model call's answer while the main
thread is busy. Whoever reads sorts what it read: a call's answer goes to the thread
that waits for it (``expect``; an async instance's loop is told it may take it without
blocking, ``when_answered``), everything else waits its turn in order for the main
thread (``receive``); an Execute or AddSlot that comes while the main thread waits on a
model call is served at once (``serve``), nested. A ReadyQuery goes to the thread that
answers the model's readiness (``wait_query``), whatever the main thread is doing.
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from reposerve.framing import FrameReader
from reposerve.instance.messages import (
    AddSlot,
    CallFailure,
    CallResponse,
    CallResult,
    Cancel,
    DropSlot,
    Execute,
    FromInstance,
    ReadyQuery,
    Resume,
    ToInstance,
    encode_frame,
)

_MAX_FDS_PER_READ = 16

Reply = CallResult | CallResponse | CallFailure
Nested = Execute | AddSlot | DropSlot  # what a model waiting on a call lets run meanwhile
T = TypeVar("T")


class Channel:
    """The worker's end of the socket: blocking reads by one thread at a time (with
    passed fds), locked writes."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = FrameReader(ToInstance)
        self._inbox: deque[ToInstance] = deque()  # for the main thread, in order
        self._replies: dict[int, deque[Reply]] = {}  # to expected calls, in order
        self._expected: set[int] = set()  # calls whose caller waits in wait_call
        self._watchers: dict[int, Callable[[], object]] = {}  # see when_answered
        self._queries: deque[ReadyQuery] = deque()  # for the readiness thread
        self._changed = threading.Condition()
        self._reading = False  # a thread is in recv (the others wait for what it reads)
        self._closed = False
        # Runs an Execute or AddSlot that arrives while a model waits on a call (sync).
        self.serve: Callable[[Nested], None] | None = None
        self._fds: deque[int] = deque()
        self._write_lock = threading.Lock()

    def receive(self) -> ToInstance | None:
        """The next message, or None once the front has gone."""
        return self._wait(lambda: self._inbox.popleft() if self._inbox else None)

    def wait_query(self) -> ReadyQuery | None:
        """The next readiness query, or None once the front has gone."""
        return self._wait(lambda: self._queries.popleft() if self._queries else None)

    def wait_resume(self, batch_id: int) -> bool:
        """Block until the front lets decoupled batch ``batch_id`` write its next response:
        True on its Resume, False on its Cancel or once the front has gone. Other frames
        wait their turn for ``receive``, in order."""

        def resume_or_cancel() -> ToInstance | None:
            for message in self._inbox:
                if isinstance(message, Resume | Cancel) and message.batch_id == batch_id:
                    self._inbox.remove(message)
                    return message
            return None

        return isinstance(self._wait(resume_or_cancel), Resume)

    def expect(self, call_id: int) -> None:
        """Model call ``call_id`` is about to be sent and its caller will ``wait_call``."""
        with self._changed:
            self._expected.add(call_id)

    def when_answered(self, call_id: int, callback: Callable[[], object]) -> None:
        """Call ``callback`` once expected call ``call_id`` has an answer waiting for
        ``wait_call`` (now, if it has; also once the front has gone), from the thread that
        read it: how an async instance's loop awaits one without blocking."""
        with self._changed:
            if self._replies.get(call_id) or self._closed:
                callback()
            else:
                self._watchers[call_id] = callback

    def wait_call(self, call_id: int) -> Reply | None:
        """Block until expected model call ``call_id``'s next answer (its one answer, or a
        decoupled call's next response or end); None once the front has gone. On the main
        thread, batches given meanwhile run now, nested (the waiting one cannot go on
        before its answer, which may need them)."""
        nested = self.serve if threading.current_thread() is threading.main_thread() else None

        def answer_or_batch() -> Reply | Nested | None:
            replies = self._replies.get(call_id)
            if replies:
                reply = replies.popleft()
                if not replies:
                    del self._replies[call_id]
                return reply
            if nested is None:
                return None
            for message in self._inbox:
                if isinstance(message, Execute | AddSlot | DropSlot):
                    self._inbox.remove(message)
                    return message
            return None

        while True:
            taken = self._wait(answer_or_batch)
            if taken is None or isinstance(taken, Reply):
                return taken
            assert nested is not None  # answer_or_batch takes batches only for it
            nested(taken)

    def _wait(self, take: Callable[[], T]) -> T:
        """What ``take`` finds (it runs under the lock), reading the socket for it when no
        other thread is; None once the front has gone."""
        with self._changed:
            while True:
                found = take()
                if found is not None or self._closed:
                    return found
                if self._reading:
                    self._changed.wait()
                    continue
                self._reading = True
                self._changed.release()
                try:
                    data, fds, _flags, _addr = socket.recv_fds(
                        self._sock, 1 << 16, _MAX_FDS_PER_READ
                    )
                except OSError:
                    data, fds = b"", []
                finally:
                    self._changed.acquire()
                    self._reading = False
                if not data:
                    self._closed = True
                    watchers, self._watchers = self._watchers, {}
                    for callback in watchers.values():
                        callback()
                self._fds.extend(fds)
                for message in self._reader.feed(data):
                    self._sort(message)
                self._changed.notify_all()

    def _sort(self, message: ToInstance) -> None:
        if isinstance(message, Reply) and message.call_id in self._expected:
            if not isinstance(message, CallResponse):  # the call's last answer
                self._expected.discard(message.call_id)
            self._replies.setdefault(message.call_id, deque()).append(message)
            watcher = self._watchers.pop(message.call_id, None)
            if watcher is not None:
                watcher()
        elif isinstance(message, ReadyQuery):
            self._queries.append(message)
        else:
            self._inbox.append(message)

    def take_fd(self) -> int:
        return self._fds.popleft()

    def send(self, message: FromInstance) -> None:
        frame = encode_frame(message)
        with self._write_lock:
            self._sock.sendall(frame)
