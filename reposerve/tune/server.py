"""The server ``reposerve tune --model-repository`` starts for itself: the repository served
as ``reposerve`` would serve it, on a free port, with only the model under test loaded."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from reposerve.errors import TuneError
from reposerve.tune.client import LOAD_TIMEOUT_S, ServerClient

STOP_GRACE_S = 30.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """In the child: SIGTERM it when tune dies, however (a SIGKILL included), so no
    server tune started outlives it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalServer:
    def __init__(self, repository: Path, model: str, log_path: Path) -> None:
        self.model = model
        self.log_path = log_path
        port = _free_port()
        command = [
            sys.executable, "-m", "reposerve",
            "--model-repository", str(repository),
            "--http-host", "127.0.0.1",
            "--http-port", str(port),
            "--allow-grpc", "false",
            "--allow-metrics", "false",
            "--model-control-mode", "explicit",
            "--load-model", model,
        ]  # fmt: skip
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.client = ServerClient(f"127.0.0.1:{port}")

    def __enter__(self) -> ServerClient:
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.client

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TuneError(f"the server exited while starting: {self._tail()}")
            try:
                entries = [e for e in self.client.index() if e["name"] == self.model]
            except TuneError:
                entries = []  # not listening yet
            states = {entry.get("state") for entry in entries}
            if "READY" in states and self.client.ready(self.model):
                return
            if entries and states == {"UNAVAILABLE"}:  # every version failed
                reasons = "; ".join(entry.get("reason", "") for entry in entries)
                raise TuneError(f"{self.model} did not load: {reasons}")
            time.sleep(0.1)
        raise TuneError(f"the server was not ready after {LOAD_TIMEOUT_S:g} s: {self._tail()}")

    def _tail(self) -> str:
        self._log.flush()
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return "\n".join(lines[-15:]) + f"\n(the whole log: {self.log_path})"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
