"""``POST .../infer`` as a bare ASGI app: the path that carries the load.

It reads the header and body straight from the ASGI messages and sends the reply in two
messages, skipping Starlette's Request and Response objects, which cost more per request
than everything reposerve itself does.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from reposerve.errors import ProtocolError, ReposerveError
from reposerve.http.access import AccessPolicy
from reposerve.http.errors import STATUS, error_body
from reposerve.service import InferenceService

log = logging.getLogger("reposerve.http")

HEADER_LENGTH = "Inference-Header-Content-Length"
INFERENCE_API = "inference"


class InferEndpoint:
    def __init__(self, service: InferenceService, policy: AccessPolicy, max_body: int) -> None:
        self._service = service
        self._policy = policy
        self._max_body = max_body
        self._checked = policy.guards(INFERENCE_API)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 200
        try:
            if self._checked:
                self._policy.check(INFERENCE_API, Request(scope))
            header_length, declared = _lengths(scope["headers"])
            if declared is not None and declared > self._max_body:
                raise _too_large(declared, self._max_body)
            body = await _read_body(receive, self._max_body)
            parameters = scope["path_params"]
            content, json_length = await self._service.infer(
                parameters["model"], parameters.get("version"), body, header_length
            )
        except _Disconnected:
            return
        except ReposerveError as exc:
            status, content, json_length = STATUS[exc.kind], error_body(exc.message), None
        except Exception as exc:
            log.exception("unhandled error on %s", scope["path"])
            status, json_length = 500, None
            content = error_body(f"internal error: {type(exc).__name__}: {exc}")
        headers = [(b"content-length", b"%d" % len(content))]
        if json_length is None:
            headers.append((b"content-type", b"application/json"))
        else:
            headers.append((b"content-type", b"application/octet-stream"))
            headers.append((b"inference-header-content-length", b"%d" % json_length))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})


class _Disconnected(Exception):
    """The client went away before its request body arrived."""


def _lengths(headers: list[tuple[bytes, bytes]]) -> tuple[int | None, int | None]:
    """(Inference-Header-Content-Length, Content-Length) in one pass over the headers."""
    header_length = content_length = None
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
    return header_length, content_length


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, refused past ``limit`` bytes before more of it is held."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(size: int, limit: int) -> ProtocolError:
    return ProtocolError(
        f"request body of {size} bytes exceeds the {limit}-byte limit (--http-max-input-size)"
    )
