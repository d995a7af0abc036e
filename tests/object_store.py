"""Real object stores for the remote-repository tests, each a process on a free port: an
S3-compatible server (moto's, in server mode, as s3fs's own tests run it) and Azure's Blob
emulator (Azurite); and a TCP relay that can lose its connections mid-transfer, as a
network does."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server import REPO_ROOT
from tools.bench.servers import free_port, stop_process

# moto accepts any key; these are the server's "credentials", which the logs must never show.
ACCESS_KEY = "AKIAREPOSERVETEST"
SECRET_KEY = "reposerve-secret-never-logged-5f3a9c"


def s3_environment() -> dict[str, str]:
    """What a server (and boto3 here) needs to reach moto: its keys and a region."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


class MotoServer:
    """``moto_server`` on a free port: ``endpoint`` is its URL."""

    def __init__(self, log_path: Path) -> None:
        pytest.importorskip("moto.server", reason="moto[server] is not installed (test extra)")
        pytest.importorskip("s3fs", reason="s3fs is not installed (test extra)")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60  # a hang detector
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.endpoint}/moto-api/", timeout=1).status_code < 500:
                    break
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start:\n{log_path.read_text()}")
            time.sleep(0.05)

    def client(self):  # boto3's S3 client, for the test to edit buckets with
        import boto3

        environment = s3_environment()
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=environment["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
            region_name=environment["AWS_DEFAULT_REGION"],
        )

    def stop(self) -> None:
        stop_process(self.process, grace_s=30)
        self._log.close()


def upload_folder(client, bucket: str, prefix: str, folder: Path) -> None:
    """Every file under ``folder`` as an object under ``bucket/prefix``."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def delete_prefix(client, bucket: str, prefix: str) -> None:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
    for entry in listed:
        client.delete_object(Bucket=bucket, Key=entry["Key"])


class CuttingRelay:
    """A TCP relay on a free port to ``target_port``. ``cut_after(n)``: once n more bytes
    have come back from the target, every connection is dropped and the port refuses new
    ones (a lost network), until ``restore()``. ``cut`` is set when that happened."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target = target_port
        self._lock = threading.Lock()
        self._budget: int | None = None
        self._sockets: list[socket.socket] = []
        self.cut = threading.Event()
        self._listen()

    def _listen(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def cut_after(self, nbytes: int) -> None:
        with self._lock:
            self._budget = nbytes

    def restore(self) -> None:
        with self._lock:
            self._budget = None
        self.cut.clear()
        self._listen()

    def close(self) -> None:
        self._drop()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: cut or stopped
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(65536):
                if counted and self._spend(len(data)):
                    self._drop()
                    return
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _spend(self, nbytes: int) -> bool:
        """Count bytes coming back; True when the budget ran out (time to cut)."""
        with self._lock:
            if self._budget is None:
                return False
            self._budget -= nbytes
            return self._budget <= 0

    def _drop(self) -> None:
        with self._lock:
            self._budget = None
            dropped, self._sockets = self._sockets, []
        with contextlib.suppress(
            OSError
        ):  # wakes the accept() blocked on it (close alone does not)
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in dropped:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.cut.set()


# Azurite's one built-in account, as its documentation publishes it (no secret of anyone's).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


class AzuriteServer:
    """Azurite's Blob server (Microsoft's Azure Storage emulator, from npm; installed by
    tools/install_azurite.sh) on a free port, keeping its data in ``folder``."""

    def __init__(self, folder: Path) -> None:
        pytest.importorskip("adlfs", reason="adlfs is not installed (test extra)")
        installed = REPO_ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
        binary = str(installed) if installed.exists() else shutil.which("azurite-blob")
        if binary is None:
            pytest.skip("azurite is not installed: run tools/install_azurite.sh")
        self.port = free_port()
        self._log = open(folder / "azurite.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
             "--location", str(folder), "--skipApiVersionCheck", "--loose"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60  # a hang detector
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"azurite did not start:\n{(folder / 'azurite.log').read_text()}"
                )
            time.sleep(0.05)

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT};"
        )

    def upload_folder(self, container: str, prefix: str, folder: Path) -> None:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(self.connection_string)
        client = service.create_container(container)
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                client.upload_blob(
                    f"{prefix}/{path.relative_to(folder).as_posix()}", path.read_bytes()
                )

    def stop(self) -> None:
        stop_process(self.process, grace_s=30)
        self._log.close()
