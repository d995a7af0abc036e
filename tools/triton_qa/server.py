"""Start reposerve where test.sh starts tritonserver, and stop it as kill_server does.

Triton's arguments are mapped here, once: those reposerve has pass through, those it lacks
are dropped and reported with the reason, so every suite's record says what changed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

PORTS = (8000, 8001, 8002)  # Triton's defaults, so the clients run unchanged

# Triton flags reposerve takes under the same name and meaning.
PASSED = {
    "--model-repository",
    "--log-verbose",
    "--model-control-mode",
    "--load-model",
    "--strict-model-config",
    "--disable-auto-complete-config",
    "--strict-readiness",
    "--exit-timeout-secs",
    "--exit-on-error",
    "--allow-client-shm",
}

# Triton flags reposerve lacks: dropped, with why that changes nothing a test checks (or
# what it does change).
DROPPED = {
    "--backend-directory": "reposerve's backends are built in",
    "--backend-config": "python backend stub settings (shm-default-byte-size, "
    "stub-timeout-seconds) have no reposerve counterpart",
    "--cuda-memory-pool-byte-size": "reposerve has no CUDA memory pool setting",
}


# reposerve flags added to every start (--server-args: front processes, say).
EXTRA_ARGS: list[str] = []


def map_args(args: list[str]) -> tuple[list[str], list[str]]:
    """Triton's argv -> (reposerve's argv, ["--flag (why dropped)", ...])."""
    out: list[str] = []
    dropped: list[str] = []
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in PASSED:
            out.append(arg)
        elif name in DROPPED:
            dropped.append(f"{arg} ({DROPPED[name]})")
        else:
            raise ValueError(f"tools/triton_qa/server.py: no mapping for Triton flag {arg}")
    out += [f"--http-port={PORTS[0]}", f"--grpc-port={PORTS[1]}", f"--metrics-port={PORTS[2]}"]
    # Where reposerve differs from Triton on purpose, the flag that asks for Triton's way:
    # a dead stub is replaced when the next request comes (which fails), not at once.
    out += ["--instance-restart=on-request", *EXTRA_ARGS]
    return out, dropped


def ports_free(timeout: float = 60.0) -> str | None:
    """None when 8000-8002 can be bound within `timeout`, else which one is taken."""
    deadline = time.monotonic() + timeout
    while True:
        busy = None
        for port in PORTS:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    busy = port
                    break
        if busy is None:
            return None
        if time.monotonic() > deadline:
            return f"port {busy} is taken (another server on Triton's ports?)"
        time.sleep(1)


@dataclass
class Live:
    """A started server, as the clients and hooks of a step see it."""

    proc: subprocess.Popen
    log: Path
    cwd: Path
    argv: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stubs(self) -> list[psutil.Process]:
        """The instance processes: Triton's triton_python_backend_stub, reposerve's workers."""
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for child in children:
            try:
                if "reposerve.instance.worker" in " ".join(child.cmdline()):
                    out.append(child)
            except psutil.Error:
                continue
        return out

    def children(self) -> list[psutil.Process]:
        """pgrep --parent $SERVER_PID"""
        try:
            return psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return []

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


_started: list[Live] = []  # every server this run started, for ``kill_all``


def start(argv: list[str], cwd: Path, log: Path, env: dict[str, str]) -> Live:
    log.parent.mkdir(parents=True, exist_ok=True)
    out = log.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reposerve", *argv],
        cwd=cwd,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    out.close()
    live = Live(proc=proc, log=log, cwd=cwd, argv=argv)
    _started.append(live)
    return live


def kill_all() -> None:
    """Whatever this run started and is still there (the run itself ended early)."""
    for live in _started:
        _kill_group(live.pid)


def _get(path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://localhost:{PORTS[0]}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_ready(live: Live, timeout: float) -> bool:
    """wait_for_server_ready: 200 from /v2/health/ready while the process lives."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not live.alive():
            return False
        time.sleep(1)
        if _get("/v2/health/ready") == 200:
            return True
    return False


def wait_exit(live: Live, timeout: float) -> bool:
    try:
        live.proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def stop(live: Live, grace: float = 60.0) -> int | None:
    """kill $SERVER_PID; wait $SERVER_PID. SIGKILL to its group after `grace` seconds."""
    if live.alive():
        live.proc.send_signal(signal.SIGTERM)
        try:
            live.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            live.notes.append(f"did not exit {grace:.0f}s after SIGTERM; killed")
    _kill_group(live.pid)
    try:
        return live.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


def _kill_group(pid: int) -> None:
    """Leftovers of the server we started (its session): instance processes orphaned by a
    kill -9 of the server itself."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
