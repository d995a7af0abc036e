"""The gRPC front: ``inference.GRPCInferenceService`` (unary RPCs) and ``grpc.health.v1``
on a ``grpc.aio`` server that shares the HTTP front's event loop.

Each handler (``UNARY``, by Triton's method name) decodes its request message, calls
``FrontService`` (the operations the HTTP front calls) and encodes the answer
(``reposerve.grpc.operations``, ``.infer``); errors become the gRPC status codes Triton
returns. Handlers are registered generically with the run-time message classes of
``reposerve.grpc.schema``: no generated stubs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import msgspec
from google.protobuf import json_format

from reposerve.access import Policy, RestrictedError
from reposerve.errors import ErrorKind, ReposerveError
from reposerve.front_service import FrontService
from reposerve.grpc import schema
from reposerve.grpc.decoding import Reclaimer, Undecodable, deserializer, status_message
from reposerve.grpc.infer import request_parts, response_encoder
from reposerve.grpc.operations import CALLS, Call, response
from reposerve.grpc.stream import serve_stream
from reposerve.operations import ServerReadyRequest
from reposerve.settings import Settings

log = logging.getLogger("reposerve.grpc")

# Triton's mapping of its error codes onto gRPC's. FORBIDDEN (reposerve's own refusals:
# control from another machine, model files in a load) is PERMISSION_DENIED; a restricted
# protocol called without its key is UNAVAILABLE, as Triton answers it.
STATUS = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorKind.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorKind.UNKNOWN: grpc.StatusCode.UNKNOWN,
}
# Metadata a client opens ModelStreamInfer with (value "true") to have an error end the
# stream with its gRPC status, as Triton does, rather than arrive as an error_message.
GRPC_ERROR_KEY = "triton_grpc_error"
_RESTRICTED_FLAG = "--grpc-restricted-protocol"
# Triton looks for a restricted protocol's KEY under this prefix in the call's metadata
# (--grpc-restricted-protocol inference:infer-key=v needs triton-grpc-protocol-infer-key: v).
RESTRICTED_PREFIX = "triton-grpc-protocol-"
# Triton lifts gRPC's 4 MiB default: messages up to 2 GiB - 1 either way.
_MAX_MESSAGE = 2**31 - 1


async def _server_live(service: FrontService, request: Any) -> Any:
    return response("ServerLive", live=True)


async def _server_ready(service: FrontService, request: Any) -> Any:
    return response("ServerReady", ready=await service.perform(ServerReadyRequest()))


async def _model_infer(service: FrontService, request: Any) -> Any:
    header, raws = request_parts(request)
    encode = response_encoder(schema.message_class(f"{schema.PACKAGE}.ModelInferResponse"), request)
    with await service.infer_parts(
        request.model_name, request.model_version or None, header, raws
    ) as answer:  # encoded straight from the instance's memory, then let go
        return encode(answer)


async def _check(service: FrontService, request: Any) -> Any:
    """grpc.health.v1.Health/Check: SERVING while the server is ready
    (``/v2/health/ready``'s answer), whatever ``service`` names: the probe asks about the
    whole server."""
    health = schema.message_class(f"{schema.HEALTH_PACKAGE}.HealthCheckResponse")
    ready = await service.perform(ServerReadyRequest())
    return health(status=1 if ready else 2)  # SERVING / NOT_SERVING


# Every unary RPC of Triton's service (``schema.METHODS``): health and inference here, the
# service's other operations from ``reposerve.grpc.operations``.
UNARY: dict[str, Call] = {
    "ServerLive": _server_live,
    "ServerReady": _server_ready,
    "ModelInfer": _model_infer,
    **CALLS,
}


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    await context.abort(code, status_message(message))


def _client_host(context: grpc.aio.ServicerContext) -> str | None:
    """The peer's address from ``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` (which gRPC may
    percent-encode: ``ipv6:%5B::1%5D:5``); None otherwise."""
    kind, _, rest = urllib.parse.unquote(context.peer()).partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None


Refusal = tuple[grpc.StatusCode, str]


def _refusal(policy: Policy, category: str, context: grpc.aio.ServicerContext) -> Refusal | None:
    """Why ``policy`` keeps the call out, if it does: a restricted protocol without its
    key is UNAVAILABLE (Triton's answer), a refusal of reposerve's its error's status."""
    metadata = dict(context.invocation_metadata() or ())
    try:
        policy.check_call(category, metadata.get, _client_host(context), _RESTRICTED_FLAG)
    except RestrictedError as exc:
        return grpc.StatusCode.UNAVAILABLE, exc.message
    except ReposerveError as exc:
        return STATUS[exc.kind], exc.message
    return None


def _unary(
    method: str,
    call: Callable[[Any], Awaitable[Any]],
    request_class: Any,
    category: str | None,
    policy: Policy,
    reclaimer: Reclaimer | None = None,
) -> grpc.RpcMethodHandler:
    # the category, when the policy guards it
    checked = category if category is not None and policy.guards(category) else None

    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        refusal = _refusal(policy, checked, context) if checked is not None else None
        if refusal is None and isinstance(request, Undecodable):
            refusal = grpc.StatusCode.INVALID_ARGUMENT, request.error
        if refusal is None:
            try:
                return await call(request)
            except ReposerveError as exc:
                refusal = STATUS[exc.kind], exc.message
            except json_format.ParseError as exc:
                log.exception("could not encode the %s response", method)
                refusal = grpc.StatusCode.INTERNAL, f"internal error: {exc}"
            except Exception as exc:  # the client gets a status, the log the traceback
                log.exception("unhandled error on %s", method)
                refusal = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
        # Aborted here, with the request let go and no exception behind the abort: gRPC
        # keeps the abort's exception (and so its frames) as long as its record of the
        # call, and a large request must not live on in them.
        del request
        await _abort(context, *refusal)

    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=deserializer(request_class, reclaimer),
        response_serializer=lambda message: message.SerializeToString(),
    )


def _streaming(
    service: FrontService, policy: Policy, reclaimer: Reclaimer | None
) -> grpc.RpcMethodHandler:
    _, request, _, category = schema.STREAM_METHOD
    checked = policy.guards(category)

    async def handle(requests: Any, context: grpc.aio.ServicerContext) -> None:
        refusal = _refusal(policy, category, context) if checked else None
        if refusal is not None:
            await _abort(context, *refusal)
        metadata = dict(context.invocation_metadata() or ())
        end_on_error = metadata.get(GRPC_ERROR_KEY) == "true"
        try:
            await serve_stream(service, requests, context.write, end_on_error)
        except ReposerveError as exc:  # only with end_on_error: the call ends with it
            await _abort(context, STATUS[exc.kind], exc.message)

    return grpc.stream_stream_rpc_method_handler(
        handle,
        request_deserializer=deserializer(
            schema.message_class(f"{schema.PACKAGE}.{request}"), reclaimer
        ),
        response_serializer=lambda message: message.SerializeToString(),
    )


def generic_handlers(
    service: FrontService, policy: Policy, reclaimer: Reclaimer | None = None
) -> list[grpc.GenericRpcHandler]:
    inference = {
        method: _unary(
            method,
            functools.partial(UNARY[method], service),
            schema.message_class(f"{schema.PACKAGE}.{request}"),
            category,
            policy,
            reclaimer,
        )
        for method, request, _, category in schema.METHODS
    }
    inference[schema.STREAM_METHOD[0]] = _streaming(service, policy, reclaimer)
    health = {
        "Check": _unary(
            "Check",
            functools.partial(_check, service),
            schema.message_class(f"{schema.HEALTH_PACKAGE}.HealthCheckRequest"),
            None,  # the probe is never restricted
            policy,
        )
    }
    return [
        grpc.method_handlers_generic_handler(schema.SERVICE, inference),
        grpc.method_handlers_generic_handler(schema.HEALTH_SERVICE, health),
    ]


class GrpcFront:
    """The gRPC server's start and stop, called from the HTTP server's lifespan."""

    def __init__(self, service: FrontService, settings: Settings) -> None:
        self._service = service
        self._settings = settings
        self._server: grpc.aio.Server | None = None
        self.port = settings.grpc_port  # the one bound, once started (--grpc-port 0)

    @property
    def address(self) -> str:
        host = self._settings.grpc_address or self._settings.http_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self._settings.grpc_port}"

    async def start(self) -> None:
        settings = self._settings
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
                ("grpc.max_send_message_length", _MAX_MESSAGE),
            ]
        )
        policy = Policy(
            [
                msgspec.structs.replace(rule, header=RESTRICTED_PREFIX + rule.header)
                for rule in settings.grpc_restricted
            ],
            noun="protocol",
        )
        reclaimer = Reclaimer(asyncio.get_running_loop())
        server.add_generic_rpc_handlers(generic_handlers(self._service, policy, reclaimer))
        try:
            if settings.grpc_use_ssl:
                port = server.add_secure_port(self.address, _credentials(settings))
            else:
                port = server.add_insecure_port(self.address)
        except RuntimeError:  # newer grpcio raises on a failed bind, older ones return 0
            port = 0
        if port == 0:
            raise OSError(
                f"gRPC: could not listen on {self.address}; is another server on that port? "
                "Choose one with --grpc-port, or turn gRPC off with --allow-grpc false"
            )
        await server.start()
        self._server = server
        self.port = port
        scheme = "grpcs" if settings.grpc_use_ssl else "grpc"
        host = self.address.rpartition(":")[0]
        log.info("gRPC front listening on %s://%s:%d", scheme, host, port)  # port 0: the one got

    async def stop(self, grace: float) -> None:
        """Refuse new RPCs and give running ones ``grace`` seconds."""
        if self._server is not None:
            await self._server.stop(grace)


def _credentials(settings: Settings) -> grpc.ServerCredentials:
    def read(path: str | None, flag: str) -> bytes:
        if not path:
            raise SystemExit(f"reposerve: --grpc-use-ssl needs {flag}")
        return Path(path).read_bytes()

    key = read(settings.grpc_server_key, "--grpc-server-key")
    cert = read(settings.grpc_server_cert, "--grpc-server-cert")
    root = None
    if settings.grpc_use_ssl_mutual or settings.grpc_root_cert:
        root = read(settings.grpc_root_cert, "--grpc-root-cert")
    return grpc.ssl_server_credentials(
        [(key, cert)], root, require_client_auth=settings.grpc_use_ssl_mutual
    )
