"""The Starlette app: the whole HTTP surface as one route list, and thin handlers.

Handlers read the path and body, call ``FrontService`` and shape the reply: each request
becomes one of the service's operations (``reposerve.operations``) and its result is
encoded as V2 JSON. The only HTTP knowledge in reposerve lives in this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from reposerve.errors import ReposerveError
from reposerve.front_service import FrontService
from reposerve.http.access import AccessPolicy
from reposerve.http.errors import HttpError, error_body, error_response, retry_after_on_503
from reposerve.http.generate import GenerateEndpoint
from reposerve.http.infer import InferEndpoint, body_deadline
from reposerve.http.openai import openai_routes
from reposerve.logs import decode_log_update
from reposerve.operations import (
    CudaSharedMemoryRegisterRequest,
    CudaSharedMemoryStatusRequest,
    CudaSharedMemoryUnregisterRequest,
    LogSettingsRequest,
    LogUpdateRequest,
    ModelConfigRequest,
    ModelMetadataRequest,
    ModelReadyRequest,
    ModelStatisticsRequest,
    ServerMetadataRequest,
    ServerReadyRequest,
    SystemSharedMemoryRegisterRequest,
    SystemSharedMemoryStatusRequest,
    SystemSharedMemoryUnregisterRequest,
)
from reposerve.protocol.documents import encode
from reposerve.protocol.repository import (
    decode_index_request,
    decode_load_request,
    decode_unload_request,
)
from reposerve.protocol.shared_memory import decode_register_request

log = logging.getLogger("reposerve.http")

JSON = "application/json"

Handler = Callable[[Request], Awaitable[Response]]


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status, media_type=JSON)


def _version(request: Request) -> str | None:
    return request.path_params.get("version")


class Handlers:
    def __init__(self, service: FrontService) -> None:
        self.service = service

    # Health answers carry the Open Inference Protocol's bodies (KServe's clients read
    # them) with Triton's status codes (tritonclient reads only those).
    async def live(self, request: Request) -> Response:
        return _json(b'{"live":true}')

    async def ready(self, request: Request) -> Response:
        if await self.service.perform(ServerReadyRequest()):
            return _json(b'{"ready":true}')
        return _json(b'{"ready":false}', 503)

    async def health(self, request: Request) -> Response:
        """vLLM's ``GET /health`` (SGLang and TGI serve it too), which OpenAI-world tools
        such as guidellm probe before they start: 200 with an empty body when the server
        can serve, else 503 (vLLM: vllm/entrypoints/serve/instrumentator/health.py)."""
        ready = await self.service.perform(ServerReadyRequest())
        return Response(status_code=200 if ready else 503)

    async def server_metadata(self, request: Request) -> Response:
        return _json(encode(await self.service.perform(ServerMetadataRequest())))

    async def model_metadata(self, request: Request) -> Response:
        operation = ModelMetadataRequest(request.path_params["model"], _version(request))
        return _json(encode(await self.service.perform(operation)))

    async def model_ready(self, request: Request) -> Response:
        name = request.path_params["model"]
        ready = await self.service.perform(ModelReadyRequest(name, _version(request)))
        return _json(encode({"name": name, "ready": ready}), 200 if ready else 400)

    async def model_config(self, request: Request) -> Response:
        operation = ModelConfigRequest(request.path_params["model"], _version(request))
        document = await self.service.perform(operation)
        return _json(encode(document.config))  # the config itself, unwrapped (Triton's)

    async def model_statistics(self, request: Request) -> Response:
        operation = ModelStatisticsRequest(request.path_params.get("model"), _version(request))
        return _json(encode(await self.service.perform(operation)))

    async def repository_index(self, request: Request) -> Response:
        query = decode_index_request(await request.body())
        return _json(encode(await self.service.perform(query)))

    async def load(self, request: Request) -> Response:
        name, body = request.path_params["model"], await request.body()
        # Off the loop: a load may carry whole model files, base64 in JSON.
        await self.service.perform(await asyncio.to_thread(decode_load_request, name, body))
        return _json(b"{}")

    async def unload(self, request: Request) -> Response:
        body = await request.body()
        await self.service.perform(decode_unload_request(request.path_params["model"], body))
        return _json(b"{}")

    async def log_settings(self, request: Request) -> Response:
        return _json(encode(await self.service.perform(LogSettingsRequest())))

    async def update_log_settings(self, request: Request) -> Response:
        update = decode_log_update(await request.body())
        return _json(encode(await self.service.perform(LogUpdateRequest(update))))

    # Triton's shared-memory extension: ``region`` absent = every region.
    async def shared_memory_status(self, request: Request) -> Response:
        operation = SystemSharedMemoryStatusRequest(request.path_params.get("region"))
        return _json(encode(await self.service.perform(operation)))

    async def register_shared_memory(self, request: Request) -> Response:
        region = decode_register_request(request.path_params["region"], await request.body())
        await self.service.perform(SystemSharedMemoryRegisterRequest(region))
        return _json(b"{}")

    async def unregister_shared_memory(self, request: Request) -> Response:
        operation = SystemSharedMemoryUnregisterRequest(request.path_params.get("region"))
        await self.service.perform(operation)
        return _json(b"{}")

    async def cuda_memory_status(self, request: Request) -> Response:
        operation = CudaSharedMemoryStatusRequest(request.path_params.get("region"))
        return _json(encode(await self.service.perform(operation)))

    async def register_cuda_memory(self, request: Request) -> Response:
        operation = CudaSharedMemoryRegisterRequest(request.path_params["region"])
        await self.service.perform(operation)
        return _json(b"{}")

    async def unregister_cuda_memory(self, request: Request) -> Response:
        operation = CudaSharedMemoryUnregisterRequest(request.path_params.get("region"))
        await self.service.perform(operation)
        return _json(b"{}")


def _guarded(handler: Handler, api: str, policy: AccessPolicy) -> Handler:
    async def endpoint(request: Request) -> Response:
        # Verbose level 1 (Triton's --log-verbose): every request but inference, which
        # carries the load and is counted in the statistics instead.
        log.debug("%s %s from %s", request.method, request.url.path, request.client)
        try:
            policy.check(api, request)
            return await handler(request)
        except ReposerveError as exc:
            return error_response(exc)
        except HttpError as exc:  # the body stalled (408)
            headers = {name.decode(): value.decode() for name, value in exc.headers}
            return Response(error_body(exc.message), exc.status, headers, JSON)
        except ClientDisconnect:
            # The client left, or the connection guard timed its body out and answered.
            return Response(status_code=400)
        except Exception as exc:  # never a bare 500 page: the client gets JSON and we log
            log.exception("unhandled error on %s", request.url.path)
            return _json(error_body(f"internal error: {type(exc).__name__}: {exc}"), 500)

    return endpoint


def routes(
    handlers: Handlers, policy: AccessPolicy, max_body: int, openai_keys: frozenset[str]
) -> list[Route]:
    """The whole HTTP surface (DESIGN.md §3): inference, then (path, handler, API,
    methods); the OpenAI-compatible routes (``reposerve.http.openai``) with them."""
    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    service = handlers.service
    endpoints = {
        "infer": InferEndpoint(service, policy, max_body),
        "generate": GenerateEndpoint(service, policy, max_body, stream=False),
        "generate_stream": GenerateEndpoint(service, policy, max_body, stream=True),
    }
    # Inference first: it carries the load (see App).
    inference = [
        Route(f"{prefix}/{action}", endpoint, methods=["POST"])
        for prefix in (model, versioned)
        for action, endpoint in endpoints.items()
    ]
    inference += [
        Route(path, endpoint, methods=[method])
        for path, endpoint, method in openai_routes(service, policy, max_body, openai_keys)
    ]
    table: list[tuple[str, Handler, str, list[str]]] = [
        ("/v2/health/live", handlers.live, "health", ["GET"]),
        ("/v2/health/ready", handlers.ready, "health", ["GET"]),
        ("/health", handlers.health, "health", ["GET"]),
        ("/v2", handlers.server_metadata, "metadata", ["GET"]),
        ("/v2/models/stats", handlers.model_statistics, "statistics", ["GET"]),
        ("/v2/repository/index", handlers.repository_index, "model-repository", ["POST"]),
        ("/v2/repository/models/{model}/load", handlers.load, "model-repository", ["POST"]),
        ("/v2/repository/models/{model}/unload", handlers.unload, "model-repository", ["POST"]),
        ("/v2/logging", handlers.log_settings, "logging", ["GET"]),
        ("/v2/logging", handlers.update_log_settings, "logging", ["POST"]),
    ]
    memory = (
        ("systemsharedmemory", handlers.shared_memory_status, handlers.register_shared_memory,
         handlers.unregister_shared_memory),
        ("cudasharedmemory", handlers.cuda_memory_status, handlers.register_cuda_memory,
         handlers.unregister_cuda_memory),
    )  # fmt: skip
    for kind, status, register, unregister in memory:
        region = f"/v2/{kind}/region/{{region}}"
        table += [
            (f"/v2/{kind}/status", status, "shared-memory", ["GET"]),
            (f"{region}/status", status, "shared-memory", ["GET"]),
            (f"{region}/register", register, "shared-memory", ["POST"]),
            (f"/v2/{kind}/unregister", unregister, "shared-memory", ["POST"]),
            (f"{region}/unregister", unregister, "shared-memory", ["POST"]),
        ]
    for prefix in (model, versioned):
        table += [
            (prefix, handlers.model_metadata, "metadata", ["GET"]),
            (f"{prefix}/ready", handlers.model_ready, "health", ["GET"]),
            (f"{prefix}/config", handlers.model_config, "model-config", ["GET"]),
            (f"{prefix}/stats", handlers.model_statistics, "statistics", ["GET"]),
        ]
    return inference + [
        Route(path, _guarded(handler, api, policy), methods=methods)
        for path, handler, api, methods in table
    ]


class App:
    """The ASGI app: inference routes are tried first and called directly; everything else
    goes through Starlette (middleware, router). Inference handles its own errors, so the
    middleware would only add cost to the one path that carries the load. Every 503 gets
    Retry-After: the infer endpoint adds it itself, the rest here. ``body_timeout``: how
    long any request body may stall before a 408, where the server keeps no such deadline
    itself (None on uvicorn, see ``connections``)."""

    def __init__(
        self, table: list[Route], lifespan: Lifespan | None, body_timeout: float | None = None
    ) -> None:
        self._body_timeout = body_timeout
        self._inference = [
            route
            for route in table
            if isinstance(route.endpoint, InferEndpoint) and "POST" in (route.methods or ())
        ]
        self._starlette = Starlette(
            routes=table,
            lifespan=lifespan,
            exception_handlers={404: _unrouted, 405: _unrouted},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._body_timeout is not None and scope["type"] == "http":
            receive = body_deadline(receive, self._body_timeout)
        if scope["type"] == "http" and scope["method"] == "POST":
            for route in self._inference:
                match, child = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child)
                    await route.endpoint(scope, receive, send)
                    return
        if scope["type"] == "http":
            send = retry_after_on_503(send)
        await self._starlette(scope, receive, send)


async def _unrouted(request: Request, exc: Exception) -> Response:
    """Paths and methods outside the route table still answer V2 error JSON."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = f"no such endpoint: {request.method} {request.url.path}"
        if request.url.path.rstrip("/") == "/metrics":  # where Prometheus users look first
            message += (
                "; metrics are served on the metrics port (--metrics-port, 8002 by "
                "default): http://<host>:8002/metrics"
            )
    return _json(error_body(message), exc.status_code)


Lifespan = Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]


def create_app(
    service: FrontService,
    policy: AccessPolicy,
    max_body: int,
    lifespan: Lifespan | None = None,
    body_timeout: float | None = None,
    openai_keys: frozenset[str] = frozenset(),
) -> App:
    """``body_timeout``: see App (None where the server keeps it); ``openai_keys``: the
    API keys the OpenAI-compatible routes require (none: they need none)."""
    table = routes(Handlers(service), policy, max_body, openai_keys)
    return App(table, lifespan, body_timeout)
