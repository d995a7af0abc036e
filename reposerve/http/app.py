"""The Starlette app: the whole HTTP surface as one route list, and thin handlers.

Handlers read the path and body, call ``InferenceService`` and shape the reply; the
only HTTP knowledge in reposerve lives in this package.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reposerve.errors import ErrorKind, ProtocolError, ReposerveError
from reposerve.http.access import AccessPolicy
from reposerve.protocol.documents import encode
from reposerve.service import InferenceService

log = logging.getLogger("reposerve.http")

JSON = "application/json"
HEADER_LENGTH = "Inference-Header-Content-Length"

STATUS = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
    ErrorKind.FORBIDDEN: 403,
}

Handler = Callable[[Request], Awaitable[Response]]


def error_response(error: ReposerveError) -> Response:
    return _json(_error_body(error.message), STATUS[error.kind])


def _error_body(message: str) -> bytes:
    return encode({"error": message})


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status, media_type=JSON)


def _version(request: Request) -> str | None:
    return request.path_params.get("version")


class Handlers:
    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.service.ready else 503)

    async def server_metadata(self, request: Request) -> Response:
        return _json(self.service.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        return _json(self.service.model_metadata(request.path_params["model"], _version(request)))

    async def model_ready(self, request: Request) -> Response:
        ready = self.service.model_ready(request.path_params["model"], _version(request))
        return Response(status_code=200 if ready else 400)

    async def model_config(self, request: Request) -> Response:
        return _json(self.service.model_config(request.path_params["model"], _version(request)))

    async def model_statistics(self, request: Request) -> Response:
        name = request.path_params.get("model")
        return _json(self.service.model_statistics(name, _version(request)))

    async def infer(self, request: Request) -> Response:
        header = request.headers.get(HEADER_LENGTH)
        header_length = None
        if header is not None:
            if not header.isdigit():
                raise ProtocolError(
                    f"{HEADER_LENGTH} must be a non-negative integer, got {header!r}"
                )
            header_length = int(header)
        body = await request.body()
        content, json_length = await self.service.infer(
            request.path_params["model"], _version(request), body, header_length
        )
        if json_length is None:
            return Response(content, media_type=JSON)
        return Response(
            content,
            media_type="application/octet-stream",
            headers={HEADER_LENGTH: str(json_length)},
        )

    async def repository_index(self, request: Request) -> Response:
        return _json(self.service.repository_index(await request.body()))

    async def load(self, request: Request) -> Response:
        await self.service.load_model(request.path_params["model"], await request.body())
        return _json(b"{}")

    async def unload(self, request: Request) -> Response:
        await self.service.unload_model(request.path_params["model"])
        return _json(b"{}")


def _guarded(handler: Handler, api: str, policy: AccessPolicy) -> Handler:
    async def endpoint(request: Request) -> Response:
        try:
            policy.check(api, request)
            return await handler(request)
        except ReposerveError as exc:
            return error_response(exc)
        except Exception as exc:  # never a bare 500 page: the client gets JSON and we log
            log.exception("unhandled error on %s", request.url.path)
            return _json(_error_body(f"internal error: {type(exc).__name__}: {exc}"), 500)

    return endpoint


def routes(handlers: Handlers, policy: AccessPolicy) -> list[Route]:
    """The whole HTTP surface (DESIGN.md §3): (path, handler, API category, methods)."""
    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    table: list[tuple[str, Handler, str, list[str]]] = [
        ("/v2/health/live", handlers.live, "health", ["GET"]),
        ("/v2/health/ready", handlers.ready, "health", ["GET"]),
        ("/v2", handlers.server_metadata, "metadata", ["GET"]),
        ("/v2/models/stats", handlers.model_statistics, "statistics", ["GET"]),
        ("/v2/repository/index", handlers.repository_index, "model-repository", ["POST"]),
        ("/v2/repository/models/{model}/load", handlers.load, "model-repository", ["POST"]),
        ("/v2/repository/models/{model}/unload", handlers.unload, "model-repository", ["POST"]),
    ]
    for prefix in (model, versioned):
        table += [
            (prefix, handlers.model_metadata, "metadata", ["GET"]),
            (f"{prefix}/ready", handlers.model_ready, "health", ["GET"]),
            (f"{prefix}/config", handlers.model_config, "model-config", ["GET"]),
            (f"{prefix}/stats", handlers.model_statistics, "statistics", ["GET"]),
            (f"{prefix}/infer", handlers.infer, "inference", ["POST"]),
        ]
    return [
        Route(path, _guarded(handler, api, policy), methods=methods)
        for path, handler, api, methods in table
    ]


def create_app(
    service: InferenceService,
    policy: AccessPolicy,
    lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]] | None = None,
) -> Starlette:
    return Starlette(routes=routes(Handlers(service), policy), lifespan=lifespan)
