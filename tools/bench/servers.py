"""Start the servers a benchmark compares, and read their time to ready and memory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from reposerve.repository.footprints import pss_bytes

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Launched:
    """A server process; ``ready_s`` is how long it took to be ready: to answer 200 on
    ``ready_path``, or, without one, to accept a connection."""

    def __init__(
        self,
        label: str,
        command: list[str],
        port: int,
        ready_path: str | None,
        log_path: Path | None = None,
        tree: Path = ROOT,
    ) -> None:
        """``tree``: the checkout whose code it runs (another revision's worktree)."""
        self.label = label
        self.port = port
        # A long run logs more than a pipe holds: with a log file nothing blocks on it.
        self._log = open(log_path, "wb") if log_path else subprocess.PIPE  # noqa: SIM115
        started = time.perf_counter()
        self.process = subprocess.Popen(
            command,
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        while not self._ready(ready_path):
            if self.process.poll() is not None:
                raise RuntimeError(f"{label} exited: {self.log()[-2000:]}")
            if time.perf_counter() - started > 120:
                raise TimeoutError(f"{label} not ready after 120 s")
            time.sleep(0.02)
        self.ready_s = time.perf_counter() - started

    def _ready(self, path: str | None) -> bool:
        try:
            if path is None:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=1) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log(self) -> str:
        if self._log is subprocess.PIPE:
            return self.process.stderr.read().decode(errors="replace")
        return Path(self._log.name).read_text(errors="replace")

    def memory_mib(self) -> float:
        """Proportional set size of the server and its child processes, in MiB."""
        return sum(pss_mib(pid) for pid in [self.process.pid, *children_of(self.process.pid)])

    def stop(self) -> None:
        stop_process(self.process, grace_s=30)
        if self._log is subprocess.PIPE:
            self.process.stderr.close()
        else:
            self._log.close()


def stop_process(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``grace_s``; reaped either way."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def reposerve_command(repository: Path, port: int, *flags: str) -> list[str]:
    """reposerve on 127.0.0.1:``port``, logging warnings, without metrics unless ``flags``
    turn them on (the last flag wins); gRPC on a port of the system's choosing, so that
    servers side by side do not contend for 8001."""
    return [
        sys.executable, "-m", "reposerve", "--model-repository", str(repository),
        "--http-host", "127.0.0.1", "--http-port", str(port), "--log-level", "warning",
        "--allow-metrics", "false", "--grpc-port", "0", *flags,
    ]  # fmt: skip


def reposerve(repository: Path, *flags: str, log_path: Path | None = None) -> Launched:
    """reposerve without metrics unless ``flags`` turn them on (the last flag wins)."""
    port = free_port()
    command = reposerve_command(repository, port, *flags)
    return Launched("reposerve", command, port, "/v2/health/ready", log_path)


def asgi(label: str, app: str, server: str) -> Launched:
    """A baseline ASGI app from ``tools.bench.baselines`` on uvicorn or Hypercorn."""
    port = free_port()
    if server == "uvicorn":
        command = [
            sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
            "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
    else:
        command = [sys.executable, "-m", "hypercorn", app, "--bind", f"127.0.0.1:{port}"]
    return Launched(label, command, port, ready_path=None)


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def pss_mib(pid: int) -> float:
    """One process's proportional set size in MiB (0 when it is gone)."""
    return pss_bytes(pid) / (1 << 20)


def environment_note() -> str:
    return f"{os.cpu_count()} cores, Python {sys.version.split()[0]}"
