"""The server ``reposerve tune --model-repository`` starts for itself: the repository served
as ``reposerve`` would serve it, on a free port, with only the model under test loaded."""

from __future__ import annotations

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
            command, stdout=subprocess.DEVNULL, stderr=self._log, start_new_session=True
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
                states = {e["name"]: e for e in self.client.index() if e.get("state")}
            except TuneError:
                states = {}  # not listening yet
            entry = states.get(self.model)
            if entry is not None and entry["state"] == "READY" and self.client.ready(self.model):
                return
            if entry is not None and entry["state"] == "UNAVAILABLE":
                raise TuneError(f"{self.model} did not load: {entry.get('reason', '')}")
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
