"""Serve the HTTP front: uvicorn (httptools, uvloop) for HTTP/1.1, Hypercorn for HTTP/2.

Either runs the event loop; its lifespan opens and closes the server
(``reposerve.server``), and SIGINT/SIGTERM go to the server's grace and shutdown, whose
budget the HTTP server's own graceful wait outlasts by ``SEND_MARGIN_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from types import FrameType
from typing import Protocol

from starlette.applications import Starlette

from reposerve.front_service import FrontService
from reposerve.http.access import AccessPolicy
from reposerve.http.app import App, create_app
from reposerve.http.connections import app_body_timeout, apply_hypercorn_limits, uvicorn_protocol
from reposerve.settings import Settings

# The HTTP server waits this much longer than the shutdown budget for the last answers
# to be written, so it never cancels a request that the budget already answered.
SEND_MARGIN_S = 5.0


class Host(Protocol):
    """What the HTTP front needs of the server it is attached to (``reposerve.server``)."""

    stop_serving: Callable[[], None]  # set here: how the server stops the HTTP server

    @property
    def service(self) -> FrontService: ...

    @property
    def signals(self) -> tuple[int, ...]:
        """The signals that make it leave."""
        ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def grace(self) -> None: ...

    def skip_grace(self) -> None: ...

    def begin_shutdown(self) -> asyncio.Task: ...

    async def leave(self, signalled: asyncio.Event) -> None: ...


def build(host: Host, settings: Settings) -> App:
    """The ASGI app, whose lifespan opens and closes ``host``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await host.open()  # a front that fails to start: those before it close too
            yield
        finally:
            await host.close()

    policy = AccessPolicy(settings.restricted)
    return create_app(
        host.service,
        policy,
        settings.http_max_input_size,
        lifespan,
        app_body_timeout(settings),
        frozenset(settings.openai_api_keys),
    )


def serve_http(host: Host, settings: Settings, sock: socket.socket | None = None) -> None:
    """Serve until a signal or a failed start-up ends ``host``; on ``sock`` (a listening
    socket shared with other fronts) when given, else on --http-host/--http-port."""
    app = build(host, settings)
    server = settings.http_server
    if server == "auto":
        server = "hypercorn" if settings.http2 else "uvicorn"
    if server == "uvicorn":
        if settings.http2:
            raise SystemExit(
                "reposerve: uvicorn has no HTTP/2; use --http-server hypercorn or auto"
            )
        _serve_uvicorn(app, host, settings, sock)
    else:
        _serve_hypercorn(app, host, settings, sock)


def listening_socket(settings: Settings) -> socket.socket:
    """The HTTP port's socket, bound and listening, for fronts to share."""
    import uvicorn

    assert settings.http_port is not None
    # No app: only the socket is made here (bind_socket reads the host and port alone).
    sock = uvicorn.Config("", host=settings.http_host, port=settings.http_port).bind_socket()
    sock.listen(2048)
    return sock


def _serve_uvicorn(app: App, host: Host, settings: Settings, sock: socket.socket | None) -> None:
    import uvicorn

    class _GracefulServer(uvicorn.Server):
        """uvicorn re-raises SIGTERM after a graceful stop, so the process reports being
        killed; we handle the signals on the loop instead and exit 0 once drained. The
        models' shutdown starts with the signal, not after uvicorn's own wait, so the
        budget is spent once."""

        _leaving: asyncio.Task | None = None

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self._leaving is not None:  # a second signal: stop waiting
                host.skip_grace()
                return
            self._leaving = asyncio.get_running_loop().create_task(self._leave(sig, frame))

        async def _leave(self, sig: int, frame: FrameType | None) -> None:
            await host.grace()
            host.begin_shutdown()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for signum in host.signals:
                loop.add_signal_handler(signum, self.handle_exit, signum, None)
            try:
                yield
            finally:
                for signum in host.signals:
                    loop.remove_signal_handler(signum)

    assert settings.http_port is not None  # serve_http runs only with an HTTP front
    config = uvicorn.Config(
        app,
        host=settings.http_host,
        port=settings.http_port,
        loop="uvloop",
        http=uvicorn_protocol(settings),  # httptools, with deadlines and a connection cap
        lifespan="on",
        access_log=False,
        log_config=None,
        # The client is the TCP peer, whatever X-Forwarded-For says (and whatever
        # FORWARDED_ALLOW_IPS trusts): who may call the control API is decided from it.
        proxy_headers=False,
        timeout_graceful_shutdown=int(settings.exit_timeout_secs + SEND_MARGIN_S),
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )
    server = _GracefulServer(config)

    def stop_server() -> None:
        server.should_exit = True

    host.stop_serving = stop_server
    server.run(sockets=None if sock is None else [sock])


def _serve_hypercorn(app: App, host: Host, settings: Settings, sock: socket.socket | None) -> None:
    import uvloop
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [
        f"{settings.http_host}:{settings.http_port}" if sock is None else f"fd://{sock.fileno()}"
    ]
    config.accesslog = None
    apply_hypercorn_limits(config, settings)
    config.graceful_timeout = settings.exit_timeout_secs + SEND_MARGIN_S
    if settings.ssl_certfile:
        # TLS with ALPN: clients negotiate h2 (or fall back to HTTP/1.1) in the handshake.
        config.certfile = settings.ssl_certfile
        config.keyfile = settings.ssl_keyfile

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in host.signals:
            loop.add_signal_handler(signum, stop.set)
        host.stop_serving = stop.set

        # hypercorn types an app's scope and events as its own TypedDicts, which no app typed
        # as ASGI's mappings (Starlette's, ours) matches (pgjones/hypercorn#353)
        await hypercorn_serve(
            app,  # type: ignore[arg-type]
            config,
            shutdown_trigger=partial(host.leave, stop),
        )

    uvloop.run(main())
