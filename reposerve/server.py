"""The server: one repository and its service, the start-up loading, the poll watcher and
the one shutdown, with the fronts attached to it (HTTP, gRPC, metrics; each may be off).

The models load in the background (readiness says when they are done; remote repositories
are copied into their cache folders first) and the start-up table is printed.
SIGINT/SIGTERM first makes the server report not ready while it goes on serving for
``--shutdown-grace-secs`` (load balancers take it out of rotation meanwhile; a second
signal ends the wait), then starts the shutdown, with one budget (``--exit-timeout-secs``)
for all of it: accepted requests may finish within it, then each one left gets its error,
and every instance process is stopped; the fronts meanwhile stop accepting and close
connections as their answers go out.

The HTTP front, when on, owns the event loop (uvicorn or Hypercorn run it) and calls
``open``/``close`` from its lifespan; without it the server runs the loop itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import uvloop

from reposerve.allocator import return_large_blocks
from reposerve.arguments import Budget
from reposerve.errors import RepositoryError
from reposerve.fronts import default_workers, usable_cores
from reposerve.fronts.workers import FrontWorkers
from reposerve.http.metrics import MetricsServer
from reposerve.http.server import SEND_MARGIN_S, listening_socket, serve_http
from reposerve.logs import LogControl, start_logging
from reposerve.repository import Repository, gpus
from reposerve.repository.remote.mirrors import Mirrors
from reposerve.repository.residency import Residency, describe_bytes
from reposerve.repository.watch import RepositoryWatcher, snapshot
from reposerve.service import InferenceService
from reposerve.settings import Settings

if TYPE_CHECKING:
    from reposerve.grpc.server import GrpcFront

log = logging.getLogger("reposerve")


class Server:
    """The lifecycle of one server process.

    ``begin_shutdown`` may be called by a signal, the HTTP lifespan's end, or a failed
    start-up; the first call fixes the deadline and later calls share its task.
    """

    def __init__(
        self,
        settings: Settings,
        logs: LogControl | None = None,
        http_socket: socket.socket | None = None,
        embedded: bool = False,
    ) -> None:
        """``http_socket``: the HTTP port's listening socket, when front processes share
        it (--http-workers above 1); ``embedded``: the process is someone else's (the
        in-process API, ``reposerve.embedded``), whose collector is left as it is."""
        self.settings = settings
        self.signals = (signal.SIGINT, signal.SIGTERM)
        mirrors = Mirrors(
            settings.model_repositories,
            settings.remote_repositories,
            settings.repository_cache_dir,
            settings.repository_cache_bytes,
        )
        repository = Repository(
            mirrors.roots,
            mirrors=mirrors,
            load_timeout=settings.load_timeout_secs,
            unload_timeout=settings.exit_timeout_secs,
            auto_complete=settings.auto_complete,
            load_threads=settings.model_load_thread_count,
            latency_summaries=settings.metrics.summary_latencies,
            restart_on_request=settings.instance_restart == "on-request",
            residency=Residency(
                settings.host_memory_budget,
                on_demand=settings.model_control_mode == "on-demand",
                gpu_budget=settings.gpu_memory_budget,
                gpu_memory=[device.memory for device in gpus.discover().visible]
                if settings.gpu_memory_budget
                else (),
            ),
        )
        self.service = InferenceService(
            repository,
            settings.model_control_mode,
            strict_readiness=settings.strict_readiness,
            allow_file_override=settings.allow_model_file_override,
            logs=logs,
            server_name=settings.server_name,
            allow_client_shm=settings.allow_client_shm,
            client_shm_max_regions=settings.client_shm_max_regions,
        )
        self.exit_code = 0
        # Ends the loop's runner (the HTTP server, or ``run``): set by whichever runs it.
        self.stop_serving: Callable[[], None] = lambda: None
        self._loading: asyncio.Task | None = None
        self._shutdown: asyncio.Task | None = None
        self._graceless = asyncio.Event()  # a second signal: no more waiting
        self._embedded = embedded
        self.loaded = asyncio.Event()  # the start-up loading is over (failed or not)
        self.load_error: BaseException | None = None  # what broke it, if anything did
        self._metrics: MetricsServer | None = None
        self._grpc: GrpcFront | None = None
        self.fronts = FrontWorkers(self.service, settings, http_socket)

    # -- the fronts beside HTTP, and the models ------------------------------------------

    async def open(self) -> None:
        """Start the metrics and gRPC fronts, then the loading of the models."""
        settings = self.settings
        if settings.metrics_port is not None:
            self._metrics = MetricsServer(
                self.service.repository,
                settings.http_host,
                settings.metrics_port,
                settings.metrics,
                self.fronts.families,
            )
            await self._metrics.start()
        if settings.grpc_port is not None:
            from reposerve.grpc.server import GrpcFront  # grpcio loads only when served

            grpc_front = GrpcFront(self.service, settings)
            await grpc_front.start()  # same event loop: no second process, no thread hop
            self._grpc = grpc_front
        await self.fronts.start(None if self._grpc is None else self._grpc.port)
        if self._shutdown is None:  # a signal during start-up may have come first
            self._loading = asyncio.get_running_loop().create_task(self._start())

    async def close(self) -> None:
        """The shutdown (started now if no signal started it), then the fronts' end."""
        stopping = self.begin_shutdown()
        if self._grpc is not None:
            # Refuse new RPCs; running ones finish or get their error within the budget.
            await self._grpc.stop(self.settings.exit_timeout_secs + SEND_MARGIN_S)
        await stopping
        # The fronts' last answers were given by the shutdown: they exit as they send them.
        await self.fronts.wait(SEND_MARGIN_S)
        if self._metrics is not None:
            await self._metrics.close()

    # -- leaving -------------------------------------------------------------------------

    async def grace(self) -> None:
        """Not ready, still serving, for the grace period (cut short by ``skip_grace``)."""
        self.service.leave()
        grace = self.settings.shutdown_grace_secs
        if grace and not self._graceless.is_set():
            log.info("leaving: not ready, serving for %g s more (--shutdown-grace-secs)", grace)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._graceless.wait(), grace)

    def skip_grace(self) -> None:
        self._graceless.set()

    def begin_shutdown(self) -> asyncio.Task:
        if self._shutdown is None:
            deadline = time.monotonic() + self.settings.exit_timeout_secs
            self.fronts.leave()  # they stop accepting, as this process's fronts do
            self._shutdown = asyncio.get_running_loop().create_task(self._stop(deadline))
        return self._shutdown

    async def leave(self, signalled: asyncio.Event) -> None:
        """From the first signal: the grace (a second signal cuts it short), then the
        shutdown's start."""
        await signalled.wait()
        signalled.clear()
        grace = asyncio.ensure_future(self.grace())
        second = asyncio.ensure_future(signalled.wait())
        await asyncio.wait((grace, second), return_when=asyncio.FIRST_COMPLETED)
        second.cancel()
        self.skip_grace()
        await grace
        self.begin_shutdown()  # the models' budget starts after the grace

    async def run(self) -> None:
        """Serve without an HTTP front: the loop is this server's until a signal."""
        signalled = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in self.signals:
            loop.add_signal_handler(signum, signalled.set)
        self.stop_serving = signalled.set
        try:
            await self.open()  # a front that fails to start: those before it close too
            await self.leave(signalled)
        finally:
            await self.close()

    async def _stop(self, deadline: float) -> None:
        log.info(
            "stopping: requests may finish within %g s (--exit-timeout-secs)",
            self.settings.exit_timeout_secs,
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

    async def start_failure(self) -> str | None:
        """Once the start-up loading is over: why it failed (its error, or under
        exit_on_error each model that failed with its reason), or None if it did not."""
        await self.loaded.wait()
        if self.load_error is not None:
            return f"the start-up loading failed: {self.load_error}"
        if not self.exit_code:
            return None
        failed = [
            f"{entry.name}: {entry.reason}"
            for entry in self.service.repository.index()
            if entry.reason and entry.state != "READY"
        ]
        return f"models failed to load (exit_on_error): {'; '.join(failed)}"

    async def _start(self) -> None:
        """Load the models, then (in poll mode) keep them in step with the disk."""
        settings = self.settings
        polling = settings.model_control_mode == "poll"
        roots = self.service.repository.roots
        try:
            going_on = await self._pull()
            baseline = await asyncio.to_thread(snapshot, roots) if polling else {}
            going_on = going_on and await self._load()
        except BaseException as exc:
            self.load_error = exc
            raise
        finally:
            self.loaded.set()
        if not going_on:
            return
        # Everything allocated so far lives as long as the server: keep the collector off
        # it, which removes its pauses from request latency.
        if not self._embedded:
            gc.collect()
            gc.freeze()
        log.info(
            "ready: serving %s on %s",
            ", ".join(
                [
                    *map(str, settings.model_repositories),
                    *(remote.url for remote in settings.remote_repositories),
                ]
            ),
            " and ".join(front_addresses(settings)) or "this process alone (no fronts)",
        )
        if front_addresses(settings):
            log.info("%s", fronts_line(settings))
        if polling:
            await RepositoryWatcher(self.service.repository, settings.repository_poll_secs).run(
                baseline
            )

    async def _pull(self) -> bool:
        """Copy the remote repositories into their cache folders; False when one cannot be
        read and --exit-on-error ends the server (else their last copies serve)."""
        try:
            await self.service.repository.mirrors.pull()
        except RepositoryError as exc:
            if not self.settings.exit_on_error:
                log.error("%s; serving the copies in the cache", exc.message)
                return True
            log.error("exiting: %s (--exit-on-error true)", exc.message)
            self._end_start_up()
            return False
        return True

    async def _load(self) -> bool:
        """The start-up loading; False when a model failed and --exit-on-error ends the
        server."""
        settings = self.settings
        service = self.service
        failed = await service.start(settings.load_models)
        residency = service.repository.residency
        log.info(
            "model control: %s; host memory budget: %s; GPU memory budget: %s",
            settings.model_control_mode,
            _budget(settings.host_memory_budget, residency.host_limit),
            _gpu_budget(settings.gpu_memory_budget, residency.gpu_limits),
        )
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
            self._end_start_up()
            return False
        return True

    def _end_start_up(self) -> None:
        """A start-up that failed ends the server, with exit status 1."""
        self.exit_code = 1
        self.begin_shutdown()
        self.stop_serving()


def front_addresses(settings: Settings) -> list[str]:
    """Where the inference fronts listen, as URLs."""
    addresses = []
    if settings.http_port is not None:
        scheme = "https" if settings.ssl_certfile else "http"
        addresses.append(f"{scheme}://{settings.http_host}:{settings.http_port}")
    if settings.grpc_port is not None:
        scheme = "grpcs" if settings.grpc_use_ssl else "grpc"
        addresses.append(
            f"{scheme}://{settings.grpc_address or settings.http_host}:{settings.grpc_port}"
        )
    return addresses


def fronts_line(settings: Settings) -> str:
    """How many processes serve each protocol, and where that number came from."""
    counts = [
        f"{protocol} {workers} process{'es' if workers > 1 else ''}"
        for protocol, workers, port in (
            ("HTTP", settings.http_workers, settings.http_port),
            ("gRPC", settings.grpc_workers, settings.grpc_port),
        )
        if port is not None
    ]
    return (
        f"fronts: {', '.join(counts)} (--http-workers, --grpc-workers; the default is "
        f"{default_workers(usable_cores())} for {usable_cores()} usable cores)"
    )


def _budget(budget: Budget | None, limit: int | None) -> str:
    if budget is None or limit is None:
        return "none"
    return f"{budget.text} ({describe_bytes(limit)})"


def _gpu_budget(budget: Budget | None, limits: dict[int, int]) -> str:
    if budget is None or not limits:
        return "none"
    each = ", ".join(f"GPU {device}: {describe_bytes(n)}" for device, n in limits.items())
    return f"{budget.text} on each GPU ({each})"


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


def _raise_descriptor_limit() -> None:
    """The soft limit on open files up to the hard one: every connection, instance slot
    and front slot holds a descriptor, and the common soft limit of 1024 is reached by a
    few hundred clients on a few front processes (which inherit the raised limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files stay limited to %d: %s", soft, exc)


def serve(settings: Settings) -> int:
    """Serve until a signal (exit status 0) or a failed start-up (1)."""
    logs = start_logging(settings)
    _raise_descriptor_limit()
    return_large_blocks()
    sock = None
    if settings.http_port is not None and settings.http_workers > 1:
        sock = listening_socket(settings)  # before any front starts: one port for all
    server = Server(settings, logs, sock)
    if settings.http_port is None:
        uvloop.run(server.run())
    else:
        serve_http(server, settings, sock)
    return server.exit_code
