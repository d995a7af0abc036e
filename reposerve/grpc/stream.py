"""ModelStreamInfer: requests flow in on one bidirectional stream, each one's responses
flow back on it as they are made, interleaved across requests, each naming its request.

Every request is served by its own task; one writer sends what they produce in order of
arrival. An error costs only its request: it becomes that request's final response
(``error_message``) and the stream goes on, as in Triton. A client that opened the call
with metadata ``triton_grpc_error: true`` asked for Triton's other way instead: the first
error ends the whole call with its gRPC status (``end_on_error``; the front aborts).
When the client cancels the call, every request still running is cancelled, which stops
its generation. Both ways are bounded: at most CALL_REQUESTS requests of a call run at
once (beyond them the call's requests are not read, and gRPC's flow control holds the
client), and at most OUTBOX_SIZE responses wait for the writer (beyond them the requests'
generations are held back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from reposerve.answers import encoded
from reposerve.errors import ProtocolError, ReposerveError
from reposerve.front_service import FrontService
from reposerve.grpc import schema
from reposerve.grpc.decoding import Undecodable
from reposerve.grpc.infer import (
    FINAL,
    request_parts,
    stream_encoder,
    stream_ending,
    wants_empty_final,
)
from reposerve.grpc.outbox import Outbox

log = logging.getLogger("reposerve.grpc")

CALL_REQUESTS = 256
OUTBOX_SIZE = 16


async def serve_stream(
    service: FrontService,
    requests: AsyncIterator[Any],
    write: Callable[[Any], Awaitable[None]],
    end_on_error: bool = False,
) -> None:
    """Serve one call; with ``end_on_error`` the first request's error is raised from
    here (a ReposerveError, after the responses sent before it) and the call is over."""
    stream_class = schema.message_class(f"{schema.PACKAGE}.ModelStreamInferResponse")
    outbox: Outbox[Any] = Outbox(OUTBOX_SIZE)
    running: set[asyncio.Task] = set()
    slots = asyncio.Semaphore(CALL_REQUESTS)

    async def send(response: Any) -> None:
        await outbox.room()
        outbox.put(response)

    async def answer(request: Any) -> None:
        try:
            if isinstance(request, Undecodable):  # the client's error: it costs this one
                raise ProtocolError(request.error)
            empty_final = wants_empty_final(request)
            header, raws = request_parts(request)
            responses = encoded(
                await service.stream_parts(
                    request.model_name, request.model_version or None, header, raws
                ),
                stream_encoder(stream_class, request),
            )
            final = False
            async with contextlib.aclosing(responses):
                async for response in responses:
                    final = response.infer_response.parameters[FINAL].bool_param
                    await send(response)
            if empty_final and not final:
                await send(stream_ending(stream_class, request))
        except ReposerveError as exc:
            if end_on_error:
                outbox.end(exc)
            elif isinstance(request, Undecodable):  # no request to name
                await send(stream_class(error_message=exc.message))
            else:
                await send(stream_ending(stream_class, request, exc.message))
        except Exception as exc:  # the client gets its request's error, the log the rest
            log.exception("unhandled error on ModelStreamInfer")
            message = f"internal error: {exc!r}"
            if end_on_error:
                outbox.end(ReposerveError(message))
            else:
                await send(stream_ending(stream_class, request, message))
        finally:
            slots.release()

    async def read() -> None:
        try:
            async for request in requests:
                await slots.acquire()
                task = asyncio.ensure_future(answer(request))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:  # the client is done sending: finish what it sent
                await asyncio.wait(set(running))
        except Exception as exc:  # the call broke: the writer raises it
            outbox.end(exc)
        else:
            outbox.end()

    reader = asyncio.ensure_future(read())
    try:
        async for response in outbox:
            await write(response)
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()
        await asyncio.gather(reader, *running, return_exceptions=True)
