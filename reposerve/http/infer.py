"""``POST .../infer`` as a bare ASGI app: the path that carries the load.

It reads the header and body straight from the ASGI messages and sends the reply in two
messages, skipping Starlette's Request and Response objects, which cost more per request
than everything reposerve itself does. Compressed bodies (``Content-Encoding``) are
inflated here as they arrive, and responses compressed when the client asks
(``Accept-Encoding``); see ``reposerve.http.encoding``.

A client that disconnects while its request waits (in a queue, in a sequence's backlog,
on an instance) cancels it, as a gRPC client's cancel does: the request leaves its queue
and takes no slot, and through a front worker the cancel crosses to the core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from reposerve.answers import Answer
from reposerve.errors import ProtocolError, ReposerveError
from reposerve.front_service import FrontService
from reposerve.http.access import AccessPolicy
from reposerve.http.encoding import (
    ACCEPTED,
    Inflater,
    compress,
    request_coding,
    response_coding,
)
from reposerve.http.errors import RETRY_AFTER, STATUS, HttpError, error_body
from reposerve.protocol.response import encode_response

log = logging.getLogger("reposerve.http")

HEADER_LENGTH = "Inference-Header-Content-Length"
INFERENCE_API = "inference"
# Responses at least this large are compressed in a worker thread (zlib lets go of the
# GIL), so a big one does not stall the event loop.
_COMPRESS_IN_THREAD = 256 * 1024
# How long a request waits before a task watches for its client leaving (``_unless_gone``).
_WATCH_AFTER_S = 0.02


class InferEndpoint:
    def __init__(self, service: FrontService, policy: AccessPolicy, max_body: int) -> None:
        self._service = service
        self._policy = policy
        self._max_body = max_body
        self._checked = policy.guards(INFERENCE_API)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 200
        extra: tuple[tuple[bytes, bytes], ...] = ()
        try:
            body, header_length, accept = await self.read(scope, receive)
            parameters = scope["path_params"]
            model = parameters["model"]
            with await _unless_gone(
                receive, self._service.infer(model, parameters.get("version"), body, header_length)
            ) as answer:  # encoded straight from the instance's memory, then let go
                content, json_length = encode_response(
                    model,
                    answer.version,
                    answer.request_id,
                    answer.outputs,
                    answer.parameters,
                    answer.shared_outputs,
                )
            coding = response_coding(accept) if accept is not None else None
            if coding is not None:
                if len(content) < _COMPRESS_IN_THREAD:
                    content = compress(content, coding)
                else:
                    content = await asyncio.to_thread(compress, content, coding)
        except Disconnected:
            return
        except Exception as exc:
            status, content, extra = error_reply(exc, scope)
            json_length, coding = None, None
        headers = [(b"content-length", b"%d" % len(content))]
        if json_length is None:
            headers.append((b"content-type", b"application/json"))
        else:
            headers.append((b"content-type", b"application/octet-stream"))
            headers.append((b"inference-header-content-length", b"%d" % json_length))
        if coding is not None:
            headers.append((b"content-encoding", coding.encode()))
            headers.append((b"vary", b"accept-encoding"))
        if status == 503:
            headers.append(RETRY_AFTER)
        headers.extend(extra)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def read(
        self, scope: Scope, receive: Receive
    ) -> tuple[bytes | bytearray, int | None, bytes | None]:
        """The request's body (checked against the access policy, size limit and body
        timeout, inflated), its Inference-Header-Content-Length and Accept-Encoding."""
        if self._checked:
            self._policy.check(INFERENCE_API, Request(scope))
        header_length, declared, encoding, accept = _scan(scope["headers"])
        if declared is not None and declared > self._max_body:
            raise _too_large(declared, self._max_body)
        inflater = None if encoding is None else _inflater(encoding, self._max_body)
        body = await _read_body(receive, self._max_body, inflater)
        return body, header_length, accept


def error_reply(exc: Exception, scope: Scope) -> tuple[int, bytes, tuple[tuple[bytes, bytes], ...]]:
    """An error raised while serving: its status, JSON body and extra headers."""
    if isinstance(exc, ReposerveError):
        return STATUS[exc.kind], error_body(exc.message), ()
    if isinstance(exc, HttpError):
        return exc.status, error_body(exc.message), exc.headers
    log.exception("unhandled error on %s", scope["path"])
    return 500, error_body(f"internal error: {type(exc).__name__}: {exc}"), ()


class Disconnected(Exception):
    """The client went away before its request body arrived, or before its answer."""


async def _unless_gone(receive: Receive, answer: Coroutine[Any, Any, Answer]) -> Answer:
    """``answer``, awaited in this task, unless the client disconnects first: then the
    wait is cancelled where it is (which takes the request out of its queue) and
    Disconnected raised. Once the body is whole, the next message the server gives is
    ``http.disconnect``; a task waits for it beside the answer, started only once the
    request has waited ``_WATCH_AFTER_S`` (the task costs ~10 us, a timer ~1.5 us: most
    answers come sooner, and cancelling one that would have come that soon saves little)."""
    waiting = asyncio.current_task()
    assert waiting is not None  # a coroutine awaited runs in a task
    watch: asyncio.Future | None = None
    gone = answered = False

    def cancel(done: asyncio.Future) -> None:
        nonlocal gone
        if not done.cancelled() and done.exception() is None and not answered:
            gone = True
            waiting.cancel()

    def start() -> None:
        nonlocal watch
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        watch.add_done_callback(cancel)

    timer = asyncio.get_running_loop().call_later(_WATCH_AFTER_S, start)
    try:
        return await answer
    except asyncio.CancelledError:
        # Its own cancel is a disconnect; any other (a server's shutdown) goes on.
        if gone and waiting.uncancel() == 0:
            raise Disconnected from None
        raise
    finally:
        answered = True  # a disconnect seen from now on cancels nothing
        timer.cancel()
        if watch is not None:
            watch.cancel()


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _scan(
    headers: list[tuple[bytes, bytes]],
) -> tuple[int | None, int | None, bytes | None, bytes | None]:
    """(Inference-Header-Content-Length, Content-Length, Content-Encoding,
    Accept-Encoding) in one pass over the headers."""
    header_length = content_length = encoding = accept = None
    for name, value in headers:
        if name == b"inference-header-content-length":
            if not value.isdigit():
                shown = value.decode(errors="replace")
                raise ProtocolError(
                    f"{HEADER_LENGTH} must be a non-negative integer, got {shown!r}"
                )
            header_length = int(value)
        elif name == b"content-length" and value.isdigit():
            content_length = int(value)
        elif name == b"content-encoding":
            encoding = value
        elif name == b"accept-encoding":
            accept = value
    return header_length, content_length, encoding, accept


def _inflater(encoding: bytes, limit: int) -> Inflater | None:
    """An Inflater for a Content-Encoding value; None for identity; 415 for the rest."""
    try:
        coding = request_coding(encoding)
    except ValueError as exc:
        raise HttpError(
            415,
            f"unsupported Content-Encoding '{exc}': request bodies may be gzip, deflate "
            "or identity",
            ((b"accept-encoding", ACCEPTED),),
        ) from None
    return None if coding is None else Inflater(coding, limit)


def body_deadline(receive: Receive, timeout: float) -> Receive:
    """``receive`` with each wait for the request body bounded by ``timeout``, the first
    included (a head that announces a body may be all a client sends): an HttpError 408
    past it. Once the body is whole, waits (for a disconnect) are unbounded again. For a
    server that keeps no such deadline itself (Hypercorn; uvicorn's is in
    ``connections``)."""
    whole = False

    async def bounded() -> Message:
        nonlocal whole
        if whole:
            return await receive()
        try:
            async with asyncio.timeout(timeout):
                message = await receive()
        except TimeoutError:
            raise HttpError(
                408,
                f"request body stalled: nothing arrived for {timeout:g} s "
                "(--http-body-timeout-secs)",
                ((b"connection", b"close"),),
            ) from None
        whole = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    return bounded


async def _read_body(receive: Receive, limit: int, inflater: Inflater | None) -> bytes | bytearray:
    """The whole body (inflated as it arrives when ``inflater`` is given), refused past
    ``limit`` bytes, compressed or inflated, before more of it is held."""
    chunks: list[bytes] = []
    size = 0
    message = await receive()
    while True:
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        if inflater is None:
            chunks.append(chunk)
        else:
            more = inflater.feed(chunk)
            while more:
                await asyncio.sleep(0)  # let other requests run between slices
                more = inflater.feed(b"")
        if not message.get("more_body", False):
            if inflater is not None:
                return inflater.finish()
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        message = await receive()


def _too_large(size: int, limit: int) -> ProtocolError:
    return ProtocolError(
        f"request body of {size} bytes exceeds the {limit}-byte limit (--http-max-input-size)"
    )
