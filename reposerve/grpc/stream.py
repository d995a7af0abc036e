"""ModelStreamInfer: requests flow in on one bidirectional stream, each one's responses
flow back on it as they are made, interleaved across requests, each naming its request.

Every request is served by its own task; one writer sends what they produce in order of
arrival. An error costs only its request: it becomes that request's final response
(``error_message``) and the stream goes on, as in Triton. When the client cancels the
call, every request still running is cancelled, which stops its generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from reposerve.errors import ReposerveError
from reposerve.grpc import schema
from reposerve.grpc.infer import (
    FINAL,
    request_parts,
    stream_encoder,
    stream_ending,
    wants_empty_final,
)
from reposerve.service import InferenceService

log = logging.getLogger("reposerve.grpc")

# Responses made and not yet written, across the call's requests: bounded, so a client that
# stops reading holds up its generations (backpressure) instead of growing this.
OUTBOX_SIZE = 16


async def serve_stream(
    service: InferenceService,
    requests: AsyncIterator[Any],
    write: Callable[[Any], Awaitable[None]],
) -> None:
    stream_class = schema.message_class(f"{schema.PACKAGE}.ModelStreamInferResponse")
    response_class = schema.message_class(f"{schema.PACKAGE}.ModelInferResponse")
    outbox: asyncio.Queue[Any] = asyncio.Queue(OUTBOX_SIZE)
    running: set[asyncio.Task] = set()

    async def answer(request: Any) -> None:
        try:
            empty_final = wants_empty_final(request)
            header, raws = request_parts(request)
            responses = service.stream_parts(
                request.model_name,
                request.model_version or None,
                header,
                raws,
                stream_encoder(stream_class, response_class, request),
            )
            final = False
            async with contextlib.aclosing(responses):
                async for response in responses:
                    final = response.infer_response.parameters[FINAL].bool_param
                    await outbox.put(response)
            if empty_final and not final:
                await outbox.put(stream_ending(stream_class, request))
        except ReposerveError as exc:
            await outbox.put(stream_ending(stream_class, request, exc.message))
        except Exception as exc:  # the client gets its request's error, the log the rest
            log.exception("unhandled error on ModelStreamInfer")
            message = f"internal error: {type(exc).__name__}: {exc}"
            await outbox.put(stream_ending(stream_class, request, message))

    async def read() -> None:
        try:
            async for request in requests:
                task = asyncio.ensure_future(answer(request))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:  # the client is done sending: finish what it sent
                await asyncio.wait(set(running))
        finally:
            await outbox.put(None)

    reader = asyncio.ensure_future(read())
    try:
        while (response := await outbox.get()) is not None:
            await write(response)
        await reader  # raises what ended the reading, if anything did
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()
