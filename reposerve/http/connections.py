"""Slow and idle clients: deadlines per connection and a cap on open connections.

uvicorn keeps a connection open as long as its client likes until a first request
completes: a client that sends half a request head, or stalls in the middle of a body,
holds a socket (and a file descriptor) for good, and enough of them exhaust the server.
``GuardedHttpTools`` is uvicorn's httptools protocol with three rules added:

1. The request head must be complete within ``--http-header-timeout-secs`` of the
   connection opening (first request) or of its first byte (later requests, which wait
   under uvicorn's keep-alive timeout before that). A partial head gets a 408 JSON error
   and the connection closes; a connection that never sent a byte just closes. Heads
   larger than ``HEAD_LIMIT`` get a 431.
2. While a body is arriving, the client may fall silent for at most
   ``--http-body-timeout-secs`` between reads: an idle timeout, not a deadline, so a large
   body on a slow link is fine as long as bytes keep coming. Time during which the server
   itself stopped reading (flow control while the app is behind) does not count. Then a
   408 JSON error, where no response has started yet, and the connection closes.
3. At most ``--http-max-connections`` connections are open. At the cap, a new connection
   closes the connection that has waited longest without running a request (an idle
   keep-alive, a half-sent head or body); if every one is running a request, the new
   connection gets a 503 with Retry-After and is closed.

Costs on the hot path: nothing per request but a few attribute writes and two dict
operations; a timer is armed only while a head or a body is incomplete at the end of a
read, which a client sending a whole small request in one write never causes.

Hypercorn (``--http2``) has its own parsers: there the head deadline is its keep-alive
timeout (a connection counts as idle until a request head is parsed), bounded by the same
flag, and the body idle timeout is kept by the infer endpoint (``InferEndpoint``).
Hypercorn offers no hook for a connection cap.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from reposerve.http.errors import raw_error_response
from reposerve.settings import Settings

log = logging.getLogger("reposerve.http")

HEAD_LIMIT = 64 * 1024  # bytes of request line and headers (nginx 32 KiB, Node 16 KiB)
HYPERCORN_KEEP_ALIVE_S = 5.0  # Hypercorn's default keep-alive timeout


class ConnectionLimits:
    """The three rules' settings (0 turns a rule off), and the connections they watch."""

    def __init__(self, header_timeout: float, body_timeout: float, max_connections: int) -> None:
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.max_connections = max_connections
        self.open = 0
        # Connections not running a request, longest-waiting first (dicts keep order).
        self.waiting: dict[GuardedHttpTools, None] = {}

    def admit(self, connection: GuardedHttpTools) -> bool:
        """Count a new connection in, closing the longest-waiting one at the cap; False
        when every open connection is running a request."""
        if self.max_connections and self.open >= self.max_connections:
            if not self.waiting:
                return False
            victim = next(iter(self.waiting))
            victim.refuse(
                503,
                f"server at its limit of {self.max_connections} connections "
                "(--http-max-connections); this one had waited longest",
            )
            self.release(victim)  # even if it stays open to finish a pipelined answer
        self.open += 1
        self.waiting[connection] = None
        return True

    def release(self, connection: GuardedHttpTools) -> None:
        if connection.admitted:
            connection.admitted = False
            self.open -= 1
            self.waiting.pop(connection, None)


class _Flow(FlowControl):
    """uvicorn's flow control, noting when reading last resumed (rule 2)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(transport)
        self._loop = loop
        self.resumed_at = 0.0

    def resume_reading(self) -> None:
        if self.read_paused:
            self.resumed_at = self._loop.time()
        super().resume_reading()


class _Corked:
    """A transport that holds a write back until the next one (or the end of the loop's
    turn) and sends the two together: uvicorn writes a response's head and its body
    apart, which costs a second system call and sends the client a second segment to
    wake for. Closing sends what is held first."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self._flush)
        else:
            self._held = None
            self._transport.writelines((held, data))

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:  # asked several times a request: not through __getattr__
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol under the rules in this module's docstring."""

    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.admitted = False
        self._in_body = False  # head parsed, body incomplete (else: waiting for a head)
        self._head_started = False  # a byte of the current request head has arrived
        self._head_bytes = 0
        self._messages = 0
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- connection --------------------------------------------------------------------

    # typeshed types any protocol's transport as a BaseTransport; a stream's is a Transport
    # (uvicorn's own connection_made says so the same way), and uvloop's is no subclass of
    # asyncio.Transport for isinstance to find
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _Flow(transport, self.loop)
        # _Corked stands in for the transport uvicorn types as asyncio.Transport: it passes
        # every other attribute through (__getattr__), which a subclass would shadow
        self.transport = _Corked(transport, self.loop)  # type: ignore[assignment]
        if not self.limits.admit(self):
            message = (
                f"server at its limit of {self.limits.max_connections} connections, all "
                "running requests (--http-max-connections)"
            )
            log.warning("%s; refusing %s", message, _peer(self.client))
            transport.write(raw_error_response(503, message))
            transport.close()
            return
        self.admitted = True
        if self.limits.header_timeout:
            self._arm(self.limits.header_timeout, self._head_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.limits.release(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_body:  # only a body in progress needs the time of a read
            self._last_read = self.loop.time()
        messages = self._messages
        in_head = not self._in_body and self._head_started
        super().data_received(data)
        if self.transport.is_closing():
            return
        if not self._in_body:
            if not self._head_started:
                return
            # A read that began inside a head still unfinished after it was all head.
            if in_head and messages == self._messages:
                self._head_bytes += len(data)
                if self._head_bytes > HEAD_LIMIT:
                    self.refuse(431, f"request head exceeds {HEAD_LIMIT} bytes")
                    return
            if self._timer is None and self.limits.header_timeout:
                self._arm(self.limits.header_timeout, self._head_expired)
        elif self._timer is None and self.limits.body_timeout:
            self._last_read = self.loop.time()  # the body began in this read
            self._arm(self.limits.body_timeout, self._body_idle)

    # -- parser callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._messages += 1
        self._head_started = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        if self._timer is not None:
            self._disarm()
        self._in_body = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self._timer is not None:
            self._disarm()
        self._in_body = False
        self._head_started = False
        super().on_message_complete()
        if self.cycle is not None and not self.cycle.response_complete:
            self.limits.waiting.pop(self, None)  # running a request: not to be evicted

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        running = self.pipeline or (
            cycle is not None and not cycle.response_complete and not cycle.more_body
        )
        if self.admitted and not running and not self.transport.is_closing():
            self.limits.waiting[self] = None  # to the back of the line

    # -- timers ------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Any) -> None:
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_expired(self) -> None:
        self._timer = None
        if self._in_body:
            return
        if self._head_started:
            self.refuse(
                408,
                f"request head not complete within {self.limits.header_timeout:g} s "
                "(--http-header-timeout-secs)",
            )
        else:
            self.transport.close()  # a new connection that never sent a byte

    def _body_idle(self) -> None:
        self._timer = None
        if not self._in_body or self.transport.is_closing():
            return
        timeout = self.limits.body_timeout
        now = self.loop.time()
        flow = self.flow
        assert isinstance(flow, _Flow)
        since = max(self._last_read, flow.resumed_at)
        if flow.read_paused or now - since < timeout:
            # Either we stopped reading (not the client's fault) or bytes came meanwhile.
            self._arm(timeout if flow.read_paused else since + timeout - now, self._body_idle)
            return
        self.refuse(
            408,
            f"request body stalled: nothing arrived for {timeout:g} s (--http-body-timeout-secs)",
        )

    # -- refusing ----------------------------------------------------------------------

    def refuse(self, status: int, message: str) -> None:
        """End this connection, answering ``status`` where a request has begun and no
        response to it is under way (a connection that sent nothing just closes)."""
        self._disarm()
        cycle = self.cycle
        running = cycle is not None and not cycle.response_complete
        if not self._in_body and running and not self.transport.is_closing():
            # A request runs, a pipelined head behind it: close once its answer is out.
            assert cycle is not None
            cycle.keep_alive = False
            self.limits.waiting.pop(self, None)
            return
        self.limits.release(self)
        if self.transport.is_closing():
            return
        answer = self._head_started or self._in_body
        if self._in_body and cycle is not None and running:
            answer = not cycle.response_started
            # The app may be waiting in receive(): it now gets http.disconnect, and any
            # response it sends is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        if answer:
            log.info("%s; closing %s", message, _peer(self.client))
            self.transport.write(raw_error_response(status, message))
        self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return "the connection" if client is None else f"{client[0]}:{client[1]}"


def uvicorn_protocol(settings: Settings) -> type[GuardedHttpTools]:
    """The protocol class to give uvicorn's Config(http=...), bound to fresh limits."""
    limits = ConnectionLimits(
        settings.http_header_timeout_secs,
        settings.http_body_timeout_secs,
        settings.http_max_connections,
    )
    return type("GuardedHttpTools", (GuardedHttpTools,), {"limits": limits})


def apply_hypercorn_limits(config: Any, settings: Settings) -> None:
    """The head deadline on Hypercorn: its keep-alive timeout, which runs until a request
    head is parsed, shortened to the flag when that is lower."""
    if settings.http_header_timeout_secs:
        config.keep_alive_timeout = min(HYPERCORN_KEEP_ALIVE_S, settings.http_header_timeout_secs)


def app_body_timeout(settings: Settings) -> float | None:
    """The body idle timeout the infer endpoint keeps itself: only on Hypercorn, since
    ``GuardedHttpTools`` keeps it on uvicorn (same choice of server as ``serve``)."""
    hypercorn = settings.http_server == "hypercorn" or (
        settings.http_server == "auto" and settings.http2
    )
    if not hypercorn or not settings.http_body_timeout_secs:
        return None
    return settings.http_body_timeout_secs
