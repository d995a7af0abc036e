"""``POST .../generate`` and ``.../generate_stream``: Triton's generate extension.

``generate`` answers one JSON document; ``generate_stream`` answers Server-Sent Events, one
``data: {...}`` event per response as the model makes it. Errors in the request (found
before the model runs) get their status and JSON body as on ``/infer``; an error the model
gives as its first response gets its status with that error as the one event, ``data:
{"error": "..."}``, as Triton answers (its L0_http generate tests read it so); one that
comes later, once the 200 has gone out, is the stream's last event. A client that
disconnects cancels its generation at once, before its first response as after: a task
waits for the disconnect beside the one waiting for responses, rather than noticing it at
the next send.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import TypeVar

from starlette.types import Receive, Scope, Send

from reposerve.answers import Answer, Answers, encoded
from reposerve.errors import InstanceError, InvalidInput, ProtocolError, ReposerveError
from reposerve.front_service import FrontService
from reposerve.http.access import AccessPolicy
from reposerve.http.errors import RETRY_AFTER, STATUS, error_body
from reposerve.http.infer import Disconnected, InferEndpoint, error_reply, wait_for_disconnect
from reposerve.protocol.generate import encode_generate

log = logging.getLogger("reposerve.http")
T = TypeVar("T")

EVENT_STREAM = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


class GenerateEndpoint(InferEndpoint):
    """``stream``: answer Server-Sent Events (generate_stream) rather than one document."""

    def __init__(
        self,
        service: FrontService,
        policy: AccessPolicy,
        max_body: int,
        stream: bool,
    ) -> None:
        super().__init__(service, policy, max_body)
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watching: asyncio.Future | None = None
        try:
            body, _, _ = await self.read(scope, receive)
            parameters = scope["path_params"]
            model = parameters["model"]
            responses = _documents(
                await self._service.generate(model, parameters.get("version"), body), model
            )
            watching = asyncio.ensure_future(wait_for_disconnect(receive))
            async with contextlib.aclosing(responses):
                if self._stream:
                    await _stream_events(responses, watching, send)
                    return
                content = await before(watching, _only_response(responses, parameters["model"]))
        except Disconnected:
            return
        except (InstanceError, InvalidInput) as exc:  # the model's answer, not the request's
            if not self._stream:
                status, content, extra = error_reply(exc, scope)
                await send_json(send, status, content, extra)
                return
            await _send_error_event(send, STATUS[exc.kind], exc.message)
            return
        except Exception as exc:
            status, content, extra = error_reply(exc, scope)
            await send_json(send, status, content, extra)
            return
        finally:
            if watching is not None:
                watching.cancel()
        await send_json(send, 200, content)


def _documents(answers: Answers, model: str) -> AsyncGenerator[bytes, None]:
    """Each answer as its JSON document, let go of as soon as it is encoded."""

    def document(answer: Answer) -> bytes:
        return encode_generate(model, answer.version, answer.request_id, answer.tensors)

    return encoded(answers, document)


async def _only_response(responses: AsyncIterator[bytes], model: str) -> bytes:
    """The one response ``generate`` answers with; a second one ends the generation."""
    found: bytes | None = None
    async for response in responses:
        if found is not None:
            raise ProtocolError(
                f"model '{model}' produced more than one response, which generate cannot "
                "carry (generate expects model to produce exactly 1 response). Hint: call "
                "generate_stream"
            )
        found = response
    if found is None:
        raise ProtocolError(
            f"model '{model}' produced no response (generate expects model to produce exactly "
            "1 response). Hint: call generate_stream"
        )
    return found


async def _stream_events(
    responses: AsyncIterator[bytes], watching: asyncio.Future, send: Send
) -> None:
    """The first response decides the status (an error before it is a plain error reply,
    raised from here); then every response is an event, until the end or a disconnect."""
    first = await before(watching, anext(responses, None))
    await send({"type": "http.response.start", "status": 200, "headers": EVENT_STREAM})
    await before(watching, _send_events(first, responses, send))


async def before(watching: asyncio.Future, work: Awaitable[T]) -> T:
    """What ``work`` gives, unless the client disconnects first (``watching`` ends): then
    ``work`` is cancelled (which stops its generation) and Disconnected raised."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait((task, watching), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this side cancelled (a server's shutdown): the work ends too
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait({task})  # before its caller closes what the work iterates
        raise
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, OSError):
        await task
    raise Disconnected


async def _send_events(first: bytes | None, responses: AsyncIterator[bytes], send: Send) -> None:
    try:
        if first is not None:
            await send(_event(first))
            async for response in responses:
                await send(_event(response))
    except ReposerveError as exc:  # the 200 has gone: the error is the last event
        await send(_event(error_body(exc.message)))
    except OSError:  # the client has gone
        return
    except Exception as exc:
        log.exception("unhandled error while streaming")
        await send(_event(error_body(f"internal error: {type(exc).__name__}: {exc}")))
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send_error_event(send: Send, status: int, message: str) -> None:
    """A stream whose first response is the model's error: its status, that one event."""
    headers = list(EVENT_STREAM)
    if status == 503:
        headers.append(RETRY_AFTER)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send(_event(error_body(message)))
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _event(document: bytes) -> dict:
    return {"type": "http.response.body", "body": b"data: " + document + b"\n\n", "more_body": True}


async def send_json(
    send: Send, status: int, content: bytes, extra: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    headers = [
        (b"content-length", b"%d" % len(content)),
        (b"content-type", b"application/json"),
        *extra,
    ]
    if status == 503:
        headers.append(RETRY_AFTER)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
