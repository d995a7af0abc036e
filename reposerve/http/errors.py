"""Error -> HTTP status and V2 error JSON: the one place that knows status codes.

Every 503 carries ``Retry-After``: it means "busy or not ready yet", and a client (or a
proxy in front) that honours the header backs off instead of retrying at once.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import Message, Send

from reposerve.errors import ErrorKind, ReposerveError
from reposerve.protocol.documents import encode

STATUS = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.UNSUPPORTED: 501,
    # Triton's HTTP front has no closer code for these: 400, as it answers them.
    ErrorKind.ALREADY_EXISTS: 400,
    ErrorKind.CANCELLED: 400,
    ErrorKind.UNKNOWN: 400,
}

RETRY_AFTER_SECS = 1
RETRY_AFTER = (b"retry-after", b"%d" % RETRY_AFTER_SECS)

_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    415: b"Unsupported Media Type",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


class HttpError(Exception):
    """A refusal that only HTTP has words for (408, 415): status, message, extra headers.

    Raised and caught inside ``reposerve.http``; the layers below raise ReposerveError.
    """

    def __init__(
        self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def error_body(message: str) -> bytes:
    return encode({"error": message})


def error_response(error: ReposerveError) -> Response:
    return Response(error_body(error.message), STATUS[error.kind], media_type="application/json")


def retry_after_on_503(send: Send) -> Send:
    """``send`` adding Retry-After to a 503 response that lacks one."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] == 503:
            headers = list(message.get("headers", ()))
            if all(name.lower() != RETRY_AFTER[0] for name, _ in headers):
                message = {**message, "headers": [*headers, RETRY_AFTER]}
        await send(message)

    return sending


def raw_error_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, for the connection
    guard, which answers below the ASGI app (a request head that never completed)."""
    body = error_body(message)
    head = [
        b"HTTP/1.1 %d %s" % (status, _REASONS[status]),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    if status == 503:
        head.append(b"%s: %s" % RETRY_AFTER)
    return b"\r\n".join(head) + b"\r\n\r\n" + body
