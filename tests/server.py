"""Start and stop a real reposerve process on a free port, for the e2e tests."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from tools.bench.servers import children_of, free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
# For repositories that hold broken models on purpose: serve the rest, ready regardless.
SERVE_BROKEN = ("--exit-on-error", "false", "--strict-readiness", "false")


class Server:
    """A reposerve process serving ``repository``; ``url`` is its base address."""

    def __init__(
        self, repository: Path, *args: str, log_path: Path, wrapper: Sequence[str] = ()
    ) -> None:
        """``wrapper``: a command the server runs under (a sandbox), before its own."""
        self.port = free_port()
        self.metrics_port = free_port()
        self.grpc_port = free_port()  # each server its own: tests run side by side
        scheme = "https" if "--ssl-certfile" in args else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._args = args
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                *wrapper,
                sys.executable, "-m", "reposerve",
                "--model-repository", str(repository),
                "--http-host", "127.0.0.1",
                "--http-port", str(self.port),
                "--metrics-port", str(self.metrics_port),
                "--grpc-port", str(self.grpc_port),
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )  # fmt: skip

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Until the server says it is ready: over HTTP, or over gRPC where HTTP is off."""
        http_off = any(
            flag == "--allow-http" and value == "false"
            for flag, value in zip(self._args, self._args[1:], strict=False)
        )
        ready = self._grpc_ready if http_off else self._http_ready
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"reposerve exited with {self.process.returncode}:\n{self.log()}"
                )
            if ready():
                return
            time.sleep(0.05)
        raise TimeoutError(f"reposerve not ready after {timeout} s:\n{self.log()}")

    def _http_ready(self) -> bool:
        try:
            answer = httpx.get(f"{self.url}/v2/health/ready", timeout=1, verify=False)
        except httpx.TransportError:
            return False
        return answer.status_code == 200

    def _grpc_ready(self) -> bool:
        import tritonclient.grpc

        with tritonclient.grpc.InferenceServerClient(self.grpc_address) as client:
            try:
                return client.is_server_ready(client_timeout=1)
            except tritonclient.utils.InferenceServerException:
                return False

    def instance_pids(self) -> list[int]:
        return children_of(self.process.pid)

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


def start_server(repository: Path, tmp_path: Path, *args: str) -> Server:
    """A ready server; the caller stops it (``running_server`` does that for you)."""
    server = Server(
        repository, *args, log_path=tmp_path / f"reposerve-{os.getpid()}-{time.monotonic_ns()}.log"
    )
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def running_server(repository: Path, tmp_path: Path, *args: str) -> Iterator[Server]:
    """A ready server for the ``with`` block, stopped after it; a server that does not
    exit cleanly (status 0) fails the test with its log."""
    server = start_server(repository, tmp_path, *args)
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"reposerve exited with {code}:\n{server.log()}"


def self_signed_certificate(folder: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, made by openssl;
    the test skips when openssl is missing."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate to test TLS with")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


# Front workers (--http-workers 2): which front a connection reached.


def front_calls(server: Server) -> int:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    found = re.search(r'^reposerve_front_calls_total\{front="1"\} (\S+)$', text, re.M)
    assert found, text
    return int(float(found[1]))


def pinned_clients(server: Server, timeout: float = 120.0) -> dict[int, httpx.Client]:
    """An HTTP client on one kept-alive connection to each front. The fronts share one
    listening socket: whichever accepts first takes a connection, so on a loaded machine
    one front may take many in a row; new connections are tried, a moment apart, until
    both fronts have one (``timeout`` is a hang detector, not a speed bound)."""
    found: dict[int, httpx.Client] = {}
    spare = []
    deadline = time.monotonic() + timeout
    while len(found) < 2 and time.monotonic() < deadline:
        if spare:
            time.sleep(0.05)  # the other front's turn to be scheduled
        client = httpx.Client(
            base_url=server.url, limits=httpx.Limits(max_connections=1), timeout=30
        )
        before = front_calls(server)
        assert client.get("/v2").status_code == 200
        front = 1 if front_calls(server) > before else 0
        if front in found:
            spare.append(client)
        else:
            found[front] = client
    for client in spare:
        client.close()
    assert len(found) == 2, "every connection landed on one front"
    return found
