"""The front processes beside the server's own: started with it, replaced when one dies,
told to leave when it shuts down.

``--http-workers N`` / ``--grpc-workers N`` count the server's own process as the first
front: front k (1 .. max(N) - 1) is a process of its own that serves HTTP when k is below
the HTTP count and gRPC when below the gRPC one. HTTP fronts accept on the listening
socket they inherit from the server; gRPC fronts bind the same port with SO_REUSEPORT
(grpcio's default). Each front talks to the server over one socket pair
(``reposerve.fronts.core`` on this side, ``.remote`` on its).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from reposerve.fronts.core import FrontPeer
from reposerve.fronts.frames import Leave
from reposerve.metrics import CustomFamily, CustomMetric
from reposerve.service import InferenceService
from reposerve.settings import Settings

log = logging.getLogger("reposerve.fronts")

SPEC_VARIABLE = "REPOSERVE_FRONT"
# A front that dies sooner than this after its start is replaced only after this pause,
# so one that cannot start does not spin.
RESTART_PAUSE_S = 1.0
REAP_TIMEOUT_S = 5.0


class FrontSpec(msgspec.Struct, frozen=True):
    """What a front process is told at its start (``SPEC_VARIABLE``, JSON)."""

    index: int
    settings: Settings
    link_fd: int  # its end of the socket pair to the server
    http_fd: int | None  # the inherited listening socket; None: it serves no HTTP
    grpc: bool


def encode_spec(spec: FrontSpec) -> str:
    return msgspec.json.encode(spec, enc_hook=str).decode()


def decode_spec(text: str) -> FrontSpec:
    def paths(kind: type, value: object) -> object:
        # Settings hold one type msgspec does not know: Path (the repositories).
        if kind is not Path:
            raise TypeError(f"a front's settings hold no {kind!r}")
        return Path(str(value))

    return msgspec.json.decode(text, type=FrontSpec, dec_hook=paths)


class _Front:
    """One front process and the core's end of its socket."""

    def __init__(self, index: int, process: subprocess.Popen, peer: FrontPeer) -> None:
        self.index = index
        self.process = process
        self.peer = peer
        self.started = time.monotonic()
        self.lost = asyncio.Event()


class FrontWorkers:
    def __init__(
        self, service: InferenceService, settings: Settings, http_socket: socket.socket | None
    ) -> None:
        self._service = service
        self._settings = settings
        self._http_socket = http_socket
        self._fronts: dict[int, _Front] = {}
        # Every front process started and not reaped yet, by pid, with its label: a front
        # counts from its spawn, not from its connection, so the shutdown reaps it.
        self._processes: dict[int, tuple[subprocess.Popen, str]] = {}
        self._watchers: set[asyncio.Task] = set()
        self._leaving = False
        self.restarts = 0  # fronts replaced after they died

    @property
    def count(self) -> int:
        """Front processes beside the server's own: as many as the protocol that is
        served by the most asks for."""
        return max(self._http_workers, self._grpc_workers, 1) - 1

    @property
    def _http_workers(self) -> int:
        return self._settings.http_workers if self._http_socket is not None else 0

    @property
    def _grpc_workers(self) -> int:
        return self._settings.grpc_workers if self._settings.grpc_port is not None else 0

    async def start(self, grpc_port: int | None) -> None:
        """Start the fronts; ``grpc_port``: the one the server's gRPC front bound."""
        if grpc_port is not None:
            self._settings = msgspec.structs.replace(self._settings, grpc_port=grpc_port)
        for index in range(1, self.count + 1):
            if self._leaving:  # a signal during the start: no more fronts
                return
            await self._spawn(index)

    async def _spawn(self, index: int) -> None:
        settings = self._settings
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        http_fd = None
        if self._http_socket is not None and index < self._http_workers:
            http_fd = self._http_socket.fileno()
        spec = FrontSpec(index, settings, theirs.fileno(), http_fd, index < self._grpc_workers)
        passed = [theirs.fileno()] + ([http_fd] if http_fd is not None else [])
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "reposerve.fronts.worker"],
                env={**os.environ, SPEC_VARIABLE: encode_spec(spec)},
                pass_fds=passed,
                # Signals to the server's process group (a terminal's Ctrl-C) are the
                # server's: it tells its fronts when to leave.
                start_new_session=True,
            )
        finally:
            theirs.close()
        label = f"front {index} (pid {process.pid})"
        self._processes[process.pid] = (process, label)
        loop = asyncio.get_running_loop()
        front: _Front | None = None

        def lost() -> None:
            if front is not None:
                front.lost.set()

        _, peer = await loop.connect_accepted_socket(
            lambda: FrontPeer(self._service, label, process.pid, lost), ours
        )
        front = _Front(index, process, peer)
        self._fronts[index] = front
        if self._leaving:  # the shutdown began while it started
            peer.send(Leave())
        watcher = loop.create_task(self._watch(front))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, front: _Front) -> None:
        """Reap the front when its socket closes, and replace it unless leaving."""
        await front.lost.wait()
        code = await asyncio.to_thread(_reap, front.process)
        self._processes.pop(front.process.pid, None)
        if self._leaving:
            return
        self.restarts += 1
        log.warning(
            "%s exited (%s) with %d call(s) running: they were cancelled; starting another",
            front.peer.label,
            f"killed by signal {-code}" if code < 0 else f"code {code}",
            front.peer.calls,
        )
        pause = RESTART_PAUSE_S - (time.monotonic() - front.started)
        if pause > 0:
            await asyncio.sleep(pause)
        if not self._leaving:
            await self._spawn(front.index)

    def families(self) -> list[CustomFamily]:
        """The fronts' metrics: calls each served (by its index; the server's own
        process is front 0, whose calls are not counted apart) and replacements."""
        if not self.count:
            return []
        calls = [
            CustomMetric((("front", str(index)),), front.peer.served)
            for index, front in sorted(self._fronts.items())
        ]
        return [
            CustomFamily(
                "reposerve_front_calls_total",
                "Calls a front process passed to the server's process, since it started",
                "counter",
                calls,
            ),
            CustomFamily(
                "reposerve_front_restarts_total",
                "Front processes replaced after they died",
                "counter",
                [CustomMetric((), self.restarts)],
            ),
        ]

    def leave(self) -> None:
        """Every front stops accepting, finishes what it accepted, and exits."""
        self._leaving = True
        for front in self._fronts.values():
            front.peer.send(Leave())

    async def wait(self, timeout: float) -> None:
        """Until every front process started has exited (connected to this one or still
        starting); those still running after ``timeout`` are killed. One thread waits for
        them all against one deadline: a thread each would queue in the loop's few
        executor threads, and the budget would stretch with their number."""
        self.leave()
        processes = list(self._processes.values())
        for label in await asyncio.to_thread(_end_all, processes, timeout):
            log.warning("%s did not exit in time: killed", label)
        self._processes.clear()
        for front in self._fronts.values():
            front.peer.close()
        for watcher in list(self._watchers):
            watcher.cancel()


def _exit_code(process: subprocess.Popen, timeout: float) -> int | None:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _end_all(processes: list[tuple[subprocess.Popen, str]], timeout: float) -> list[str]:
    """Wait for ``processes`` until ``timeout`` from now, then kill and reap the rest;
    returns the labels of those killed."""
    deadline = time.monotonic() + timeout
    killed = []
    for process, label in processes:
        if _exit_code(process, max(deadline - time.monotonic(), 0)) is None:
            process.kill()
            process.wait()
            killed.append(label)
    return killed


def _reap(process: subprocess.Popen) -> int:
    """Its exit status, killed first if it has not exited within REAP_TIMEOUT_S."""
    code = _exit_code(process, REAP_TIMEOUT_S)
    if code is None:
        process.kill()
        code = process.wait()
    return code
