"""Error -> HTTP status and V2 error JSON: the one place that knows status codes."""

from __future__ import annotations

from starlette.responses import Response

from reposerve.errors import ErrorKind, ReposerveError
from reposerve.protocol.documents import encode

STATUS = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
    ErrorKind.FORBIDDEN: 403,
}


def error_body(message: str) -> bytes:
    return encode({"error": message})


def error_response(error: ReposerveError) -> Response:
    return Response(error_body(error.message), STATUS[error.kind], media_type="application/json")
