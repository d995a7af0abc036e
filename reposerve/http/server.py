"""Serve the app: uvicorn (httptools, uvloop) for HTTP/1.1, Hypercorn for HTTP/2.

The lifespan loads the models in the background (``/v2/health/ready`` says when they
are done) and prints the start-up table. SIGINT/SIGTERM first makes the server report
not ready while it goes on serving for ``--shutdown-grace-secs`` (load balancers take it
out of rotation meanwhile; a second signal ends the wait), then starts the shutdown, with
one budget (``--exit-timeout-secs``) for all of it: accepted requests may finish within
it, then each one left gets a JSON error, and every instance process is stopped; the
HTTP server meanwhile stops accepting and closes connections as their answers go out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator

from starlette.applications import Starlette

from reposerve.http.access import AccessPolicy
from reposerve.http.app import App, create_app
from reposerve.http.connections import app_body_timeout, apply_hypercorn_limits, uvicorn_protocol
from reposerve.http.metrics import MetricsServer
from reposerve.logs import LogControl, LogSettings, redirect_output
from reposerve.repository import Repository
from reposerve.repository.watch import RepositoryWatcher, snapshot
from reposerve.service import InferenceService
from reposerve.settings import Settings

log = logging.getLogger("reposerve")


# The HTTP server waits this much longer than the shutdown budget for the last answers
# to be written, so it never cancels a request that the budget already answered.
_SEND_MARGIN_S = 5.0


class Lifecycle:
    """Start-up loading and the one shutdown of a server.

    ``begin_shutdown`` may be called by a signal handler, the lifespan's end, or a failed
    start-up; the first call fixes the deadline and later calls share its task.
    """

    def __init__(self, service: InferenceService, settings: Settings) -> None:
        self.service = service
        self.exit_code = 0
        self.stop_server: Callable[[], None] = lambda: None  # set by the HTTP server runner
        self._settings = settings
        self._loading: asyncio.Task | None = None
        self._shutdown: asyncio.Task | None = None
        self._graceless = asyncio.Event()  # a second signal: no more waiting

    def start_loading(self) -> None:
        if self._shutdown is None:  # a signal during start-up may have come first
            self._loading = asyncio.get_running_loop().create_task(self._start())

    async def grace(self) -> None:
        """Not ready, still serving, for the grace period (cut short by ``skip_grace``)."""
        self.service.leave()
        if self._settings.shutdown_grace_secs and not self._graceless.is_set():
            log.info(
                "leaving: not ready, serving for %g s more (--shutdown-grace-secs)",
                self._settings.shutdown_grace_secs,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._graceless.wait(), self._settings.shutdown_grace_secs)

    def skip_grace(self) -> None:
        self._graceless.set()

    def begin_shutdown(self) -> asyncio.Task:
        if self._shutdown is None:
            deadline = time.monotonic() + self._settings.exit_timeout_secs
            self._shutdown = asyncio.get_running_loop().create_task(self._stop(deadline))
        return self._shutdown

    async def _stop(self, deadline: float) -> None:
        log.info(
            "stopping: requests may finish within %g s (--exit-timeout-secs)",
            self._settings.exit_timeout_secs,
        )
        if self._loading is not None:
            self._loading.cancel()
            try:
                await self._loading
            except asyncio.CancelledError:
                pass
            except Exception:  # whatever broke the loading or polling, the models still stop
                log.exception("model loading or polling had failed")
        await self.service.stop(deadline)
        log.info("stopped: every model unloaded")

    async def _start(self) -> None:
        """Load the models, then (in poll mode) keep them in step with the disk."""
        settings = self._settings
        service = self.service
        polling = settings.model_control_mode == "poll"
        roots = service.repository.roots
        baseline = await asyncio.to_thread(snapshot, roots) if polling else {}
        failed = await service.start(settings.load_models)
        # A line a record: the text log escapes line breaks inside a message.
        for line in ["models:", *startup_table(service).splitlines()]:
            log.info("%s", line)
        if failed and settings.exit_on_error:
            names = ", ".join(entry.name for entry in failed)
            log.error(
                "exiting: %s failed to load (--exit-on-error true; pass --exit-on-error false "
                "to serve the other models)",
                names,
            )
            self.exit_code = 1
            self.begin_shutdown()
            self.stop_server()
            return
        # Everything allocated so far lives as long as the server: keep the collector off
        # it, which removes its pauses from request latency.
        gc.collect()
        gc.freeze()
        grpc = ""
        if settings.grpc_port is not None:
            grpc = f" and grpc://{settings.grpc_address or settings.http_host}:{settings.grpc_port}"
        log.info(
            "ready: serving %s on http://%s:%d%s",
            ", ".join(map(str, settings.model_repositories)),
            settings.http_host,
            settings.http_port,
            grpc,
        )
        if polling:
            await RepositoryWatcher(service.repository, settings.repository_poll_secs).run(baseline)


def build(settings: Settings, logs: LogControl | None = None) -> tuple[App, Lifecycle]:
    repository = Repository(
        [root.resolve() for root in settings.model_repositories],
        load_timeout=settings.load_timeout_secs,
        unload_timeout=settings.exit_timeout_secs,
        auto_complete=settings.auto_complete,
        load_threads=settings.model_load_thread_count,
        latency_summaries=settings.metrics.summary_latencies,
        restart_on_request=settings.instance_restart == "on-request",
    )
    service = InferenceService(
        repository,
        settings.model_control_mode,
        strict_readiness=settings.strict_readiness,
        allow_file_override=settings.allow_model_file_override,
        logs=logs,
        server_name=settings.server_name,
    )
    lifecycle = Lifecycle(service, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        metrics = None
        if settings.metrics_port is not None:
            metrics = MetricsServer(
                service, settings.http_host, settings.metrics_port, settings.metrics
            )
            await metrics.start()
        grpc_front = None
        if settings.grpc_port is not None:
            from reposerve.grpc.server import GrpcFront  # grpcio loads only when served

            grpc_front = GrpcFront(service, settings)
            await grpc_front.start()  # same event loop: no second process, no thread hop
        lifecycle.start_loading()
        try:
            yield
        finally:
            stopping = lifecycle.begin_shutdown()
            if grpc_front is not None:
                # Refuse new RPCs; running ones finish or get their error within the budget.
                await grpc_front.stop(settings.exit_timeout_secs + _SEND_MARGIN_S)
            await stopping
            if metrics is not None:
                await metrics.close()

    policy = AccessPolicy(settings.restricted)
    return create_app(
        service, policy, settings.http_max_input_size, lifespan, app_body_timeout(settings)
    ), lifecycle


def start_logging(settings: Settings) -> LogControl:
    """Route this process's output (and its instances') as the --log-* flags say."""
    if settings.log_file:
        redirect_output(settings.log_file)
    return LogControl(
        LogSettings(
            log_file=settings.log_file,
            log_info=settings.log_info,
            log_warning=settings.log_warning,
            log_error=settings.log_error,
            log_verbose_level=settings.log_verbose,
            log_format=settings.log_format,  # type: ignore[arg-type]  # checked by the CLI
        ),
        sys.stderr,
    )


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


def serve(settings: Settings) -> int:
    """Serve until a signal (exit status 0) or a failed start-up (1)."""
    app, lifecycle = build(settings, start_logging(settings))
    server = settings.http_server
    if server == "auto":
        server = "hypercorn" if settings.http2 else "uvicorn"
    if server == "uvicorn":
        if settings.http2:
            raise SystemExit(
                "reposerve: uvicorn has no HTTP/2; use --http-server hypercorn or auto"
            )
        _serve_uvicorn(app, lifecycle, settings)
    else:
        _serve_hypercorn(app, lifecycle, settings)
    return lifecycle.exit_code


def _serve_uvicorn(app: App, lifecycle: Lifecycle, settings: Settings) -> None:
    import uvicorn

    class _GracefulServer(uvicorn.Server):
        """uvicorn re-raises SIGTERM after a graceful stop, so the process reports being
        killed; we handle the signals on the loop instead and exit 0 once drained. The
        models' shutdown starts with the signal, not after uvicorn's own wait, so the
        budget is spent once."""

        def handle_exit(self, sig: int, frame: object) -> None:
            if self._leaving is not None:  # a second signal: stop waiting
                lifecycle.skip_grace()
                return
            self._leaving = asyncio.get_running_loop().create_task(self._leave(sig, frame))

        async def _leave(self, sig: int, frame: object) -> None:
            await lifecycle.grace()
            lifecycle.begin_shutdown()
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

        _leaving: asyncio.Task | None = None

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
        http=uvicorn_protocol(settings),  # httptools, with deadlines and a connection cap
        lifespan="on",
        access_log=False,
        log_config=None,
        # The client is the TCP peer, whatever X-Forwarded-For says (and whatever
        # FORWARDED_ALLOW_IPS trusts): who may call the control API is decided from it.
        proxy_headers=False,
        timeout_graceful_shutdown=int(settings.exit_timeout_secs + _SEND_MARGIN_S),
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )
    server = _GracefulServer(config)

    def stop_server() -> None:
        server.should_exit = True

    lifecycle.stop_server = stop_server
    server.run()


def _serve_hypercorn(app: App, lifecycle: Lifecycle, settings: Settings) -> None:
    import uvloop
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"{settings.http_host}:{settings.http_port}"]
    config.accesslog = None
    apply_hypercorn_limits(config, settings)
    config.graceful_timeout = settings.exit_timeout_secs + _SEND_MARGIN_S
    if settings.ssl_certfile:
        # TLS with ALPN: clients negotiate h2 (or fall back to HTTP/1.1) in the handshake.
        config.certfile = settings.ssl_certfile
        config.keyfile = settings.ssl_keyfile

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        lifecycle.stop_server = stop.set

        async def shutdown_trigger() -> None:
            await stop.wait()
            stop.clear()
            grace = asyncio.ensure_future(lifecycle.grace())
            second = asyncio.ensure_future(stop.wait())
            await asyncio.wait((grace, second), return_when=asyncio.FIRST_COMPLETED)
            second.cancel()
            lifecycle.skip_grace()
            await grace
            lifecycle.begin_shutdown()  # the models' budget starts after the grace

        await hypercorn_serve(app, config, shutdown_trigger=shutdown_trigger)

    uvloop.run(main())
