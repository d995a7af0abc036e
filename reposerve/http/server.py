"""Serve the app: uvicorn (httptools, uvloop) for HTTP/1.1, Hypercorn for HTTP/2.

The lifespan loads the models in the background (``/v2/health/ready`` says when they
are done), prints the start-up table, and on SIGINT/SIGTERM drains and stops every
instance process before the server exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Iterator

from starlette.applications import Starlette

from reposerve.http.access import AccessPolicy
from reposerve.http.app import App, create_app
from reposerve.http.metrics import MetricsServer
from reposerve.repository import Repository
from reposerve.repository.watch import RepositoryWatcher, snapshot
from reposerve.service import InferenceService
from reposerve.settings import Settings

log = logging.getLogger("reposerve")


def build(settings: Settings) -> tuple[App, InferenceService]:
    repository = Repository(
        settings.model_repository.resolve(),
        load_timeout=settings.load_timeout_secs,
        unload_timeout=settings.exit_timeout_secs,
    )
    service = InferenceService(repository, settings.model_control_mode)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        metrics = None
        if settings.metrics_port is not None:
            metrics = MetricsServer(service, settings.http_host, settings.metrics_port)
            await metrics.start()
        loading = asyncio.create_task(_start(service, settings))
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            log.info("stopping: draining requests and stopping instances")
            await service.stop()
            if metrics is not None:
                await metrics.close()

    policy = AccessPolicy(settings.restricted)
    return create_app(service, policy, settings.http_max_input_size, lifespan), service


async def _start(service: InferenceService, settings: Settings) -> None:
    """Load the models, then (in poll mode) keep them in step with the disk until cancelled."""
    polling = settings.model_control_mode == "poll"
    root = service.repository.root
    baseline = await asyncio.to_thread(snapshot, root) if polling else {}
    await service.start(settings.load_models)
    log.info("models:\n%s", startup_table(service))
    # Everything allocated so far lives as long as the server: keep the collector off it,
    # which removes its pauses from request latency.
    gc.collect()
    gc.freeze()
    log.info(
        "ready: serving %s on http://%s:%d",
        settings.model_repository,
        settings.http_host,
        settings.http_port,
    )
    if polling:
        await RepositoryWatcher(service.repository, settings.repository_poll_secs).run(baseline)


def startup_table(service: InferenceService) -> str:
    rows = [("MODEL", "VERSION", "BACKEND", "INSTANCES", "STATE")]
    loaded = {(v.name, v.version): v for v in service.repository.loaded()}
    for entry in service.repository.index():
        version = loaded.get((entry.name, int(entry.version))) if entry.version else None
        state = entry.state or "NOT LOADED"
        if entry.reason and entry.state != "READY":
            state = f"{state}: {entry.reason}"
        rows.append(
            (
                entry.name,
                entry.version or "-",
                version.backend if version else "-",
                str(len(version.instances)) if version else "-",
                state,
            )
        )
    widths = [max(len(row[column]) for row in rows[:]) for column in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True))
        + "  "
        + row[4]
        for row in rows
    )


def serve(settings: Settings) -> None:
    app, _ = build(settings)
    server = settings.http_server
    if server == "auto":
        server = "hypercorn" if settings.http2 else "uvicorn"
    if server == "uvicorn":
        if settings.http2:
            raise SystemExit(
                "reposerve: uvicorn has no HTTP/2; use --http-server hypercorn or auto"
            )
        _serve_uvicorn(app, settings)
    else:
        _serve_hypercorn(app, settings)


def _serve_uvicorn(app: App, settings: Settings) -> None:
    import uvicorn

    class _GracefulServer(uvicorn.Server):
        """uvicorn re-raises SIGTERM after a graceful stop, so the process reports being
        killed; we handle the signals on the loop instead and exit 0 once drained."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, self.handle_exit, signum, None)
            try:
                yield
            finally:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(signum)

    config = uvicorn.Config(
        app,
        host=settings.http_host,
        port=settings.http_port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=int(settings.exit_timeout_secs),
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )
    _GracefulServer(config).run()


def _serve_hypercorn(app: App, settings: Settings) -> None:
    import uvloop
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"{settings.http_host}:{settings.http_port}"]
    config.accesslog = None
    config.graceful_timeout = settings.exit_timeout_secs
    if settings.ssl_certfile:
        # TLS with ALPN: clients negotiate h2 (or fall back to HTTP/1.1) in the handshake.
        config.certfile = settings.ssl_certfile
        config.keyfile = settings.ssl_keyfile

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await hypercorn_serve(app, config, shutdown_trigger=stop.wait)

    uvloop.run(main())
