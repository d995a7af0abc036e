"""The instance process's end of its socket to the front: frames in (with the file
descriptors of new slots passed beside them), frames out.

Reads block. While a sync model waits (for a decoupled batch's Resume, or a model call's
answer) frames that are not for it wait their turn, in order, for ``receive``; an Execute
or AddSlot that comes while a model call waits is served at once (``serve``), nested.
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Callable

from reposerve.instance.messages import (
    AddSlot,
    CallFailure,
    CallResult,
    Cancel,
    Execute,
    FrameReader,
    FromInstance,
    Resume,
    ToInstance,
    encode_frame,
)

_MAX_FDS_PER_READ = 16


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
            if isinstance(message, CallResult | CallFailure):  # for a call further out
                self._replies[message.call_id] = message
            else:
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
