"""Remote repositories: reposerve serving a bucket of a real S3-compatible server (moto's,
a process on a free port) through its local copy, in Triton's s3://host:port form and with
the endpoint from the environment; polls and explicit loads following the bucket; a
restart reusing the unchanged copy; the size bound; a connection lost mid-copy; and the
credentials never in the log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.object_store import (
    AZURITE_KEY,
    SECRET_KEY,
    AzuriteServer,
    CuttingRelay,
    MotoServer,
    delete_prefix,
    s3_environment,
    upload_folder,
)
from tests.server import REPO_ROOT, Server, running_server, start_server
from tests.toy_models import vector_config, write_model
from tools.bench.servers import free_port

pytestmark = pytest.mark.e2e

ADD = """
    class Model:
        def execute(self, inputs):
            return {{"OUTPUT": inputs["INPUT"] + {amount}}}
"""
BODY = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [0]}]}


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def bucket(moto: MotoServer, request: pytest.FixtureRequest, monkeypatch) -> str:
    """A fresh bucket for the test; the servers it starts inherit the S3 credentials."""
    for key, value in s3_environment().items():
        monkeypatch.setenv(key, value)
    name = request.node.name.replace("_", "-")[:40].strip("-").lower()
    moto.client().create_bucket(Bucket=name)
    return name


def put_model(moto: MotoServer, bucket: str, tmp_path: Path, name: str, amount: int) -> None:
    """The model ``name`` (OUTPUT = INPUT + amount) uploaded under ``bucket/repo``."""
    folder = write_model(tmp_path / f"staging-{time.monotonic_ns()}", name, vector_config(size=1),
                         ADD.format(amount=amount))  # fmt: skip
    upload_folder(moto.client(), bucket, f"repo/{name}", folder)


def answer(server: Server, model: str) -> float | None:
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=BODY, timeout=30)
    return response.json()["outputs"][0]["data"][0] if response.status_code == 200 else None


def eventually(check, what: str, timeout: float = 60.0):
    """``check()``'s first true result; ``timeout`` is a hang detector."""
    deadline = time.monotonic() + timeout
    while True:
        if result := check():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {what}")
        time.sleep(0.1)


def files_of(cache: Path) -> dict[str, tuple[int, int]]:
    """Each file of the copy, by path, with its inode and modification time."""
    return {
        str(path.relative_to(cache)): (path.stat().st_ino, path.stat().st_mtime_ns)
        for path in cache.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_a_bucket_serves_in_tritons_form_and_a_restart_reuses_its_copy(moto, bucket, tmp_path):
    import tritonclient.http

    put_model(moto, bucket, tmp_path, "add", amount=1)
    cache = tmp_path / "cache"
    url = f"s3://127.0.0.1:{moto.port}/{bucket}/repo"
    arguments = ("--repository-cache-dir", str(cache), "--log-verbose", "1")
    with running_server(url, tmp_path, *arguments) as server:
        with tritonclient.http.InferenceServerClient(server.address) as client:
            given = tritonclient.http.InferInput("INPUT", [1, 1], "FP32")
            given.set_data_from_numpy(np.array([[2.0]], dtype=np.float32))
            result = client.infer("add", [given])
            assert result.as_numpy("OUTPUT").tolist() == [[3.0]]
        assert f"ready: serving {url}" in server.log()
        copied = files_of(cache)
        assert any("/snapshots/add." in path and path.endswith("/1/model.py") for path in copied)
    # Unchanged in the bucket: the next start serves the same files, downloading none.
    with running_server(url, tmp_path, *arguments) as again:
        assert answer(again, "add") == 1.0
        assert files_of(cache) == copied
    for log in (server.log(), again.log()):
        assert SECRET_KEY not in log


def test_poll_mode_follows_a_bucket_whose_endpoint_the_environment_names(
    moto, bucket, tmp_path, monkeypatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    put_model(moto, bucket, tmp_path, "first", amount=1)
    server = start_server(
        f"s3://{bucket}/repo",
        tmp_path,
        "--repository-cache-dir", str(tmp_path / "cache"),
        "--model-control-mode", "poll",
        "--repository-poll-secs", "0.2",
    )  # fmt: skip
    try:
        assert answer(server, "first") == 1.0
        put_model(moto, bucket, tmp_path, "second", amount=5)  # added
        eventually(lambda: answer(server, "second") == 5.0, "the added model answers")
        put_model(moto, bucket, tmp_path, "first", amount=3)  # changed
        eventually(lambda: answer(server, "first") == 3.0, "the changed model answers anew")
        delete_prefix(moto.client(), bucket, "repo/second")  # removed
        eventually(
            lambda: httpx.get(f"{server.url}/v2/models/second/ready").status_code == 400,
            "the removed model is unloaded",
        )
    finally:
        assert server.stop() == 0, server.log()
    assert SECRET_KEY not in server.log()


def test_an_explicit_load_pulls_the_model_from_the_bucket_again(moto, bucket, tmp_path):
    put_model(moto, bucket, tmp_path, "add", amount=1)
    url = f"s3://127.0.0.1:{moto.port}/{bucket}/repo"
    with running_server(
        url,
        tmp_path,
        "--repository-cache-dir", str(tmp_path / "cache"),
        "--model-control-mode", "explicit",
        "--load-model", "add",
    ) as server:  # fmt: skip
        put_model(moto, bucket, tmp_path, "add", amount=7)
        put_model(moto, bucket, tmp_path, "late", amount=9)
        assert answer(server, "add") == 1.0  # no load asked for: the copy stays
        for model, expected in (("add", 7.0), ("late", 9.0)):
            response = httpx.post(f"{server.url}/v2/repository/models/{model}/load", timeout=60)
            assert response.status_code == 200, response.text
            assert answer(server, model) == expected


def test_a_connection_lost_mid_copy_leaves_the_last_copy_serving(moto, bucket, tmp_path):
    put_model(moto, bucket, tmp_path, "add", amount=1)
    relay = CuttingRelay(moto.port)
    url = f"s3://127.0.0.1:{relay.port}/{bucket}/repo"
    cache = tmp_path / "cache"
    server = start_server(
        url,
        tmp_path,
        "--repository-cache-dir", str(cache),
        "--model-control-mode", "poll",
        "--repository-poll-secs", "0.2",
    )  # fmt: skip
    try:
        served = files_of(cache)
        # A new version with weights of 8 MiB, uploaded first (a poll between two uploads
        # copies what it sees): the relay drops every connection 1 MiB into its download,
        # and refuses new ones until restored.
        relay.cut_after(1 << 20)
        client = moto.client()
        client.put_object(Bucket=bucket, Key="repo/add/1/weights.bin", Body=os.urandom(8 << 20))
        assert relay.cut.wait(60), "the download never started"
        put_model(moto, bucket, tmp_path, "add", amount=4)
        eventually(
            lambda: f"poll: {url}: cannot read the repository" in server.log(),
            "the lost connection is reported",
        )
        assert "The last copy pulled keeps serving" in server.log()
        assert answer(server, "add") == 1.0
        assert files_of(cache) == served  # nothing half-copied in it
        relay.restore()
        eventually(lambda: answer(server, "add") == 4.0, "the new version serves once restored")
    finally:
        relay.close()
        assert server.stop() == 0, server.log()
    assert SECRET_KEY not in server.log()


def failed_start(url: str, tmp_path: Path, *args: str) -> str:
    """The log of a server on ``url`` that must exit with status 1 before it is ready."""
    server = Server(
        url,
        "--repository-cache-dir", str(tmp_path / "cache"),
        *args,
        log_path=tmp_path / "server.log",
    )  # fmt: skip
    try:
        assert server.process.wait(120) == 1, server.log()
    finally:
        server.stop()
    return server.log()


def test_a_repository_over_the_size_bound_is_refused_at_start_up(moto, bucket, tmp_path):
    put_model(moto, bucket, tmp_path, "add", amount=1)
    url = f"s3://127.0.0.1:{moto.port}/{bucket}/repo"
    log = failed_start(url, tmp_path, "--repository-cache-bytes", "100")
    assert f"exiting: {url}: the repository holds 0 MiB (" in log
    assert (
        "bytes), over --repository-cache-bytes 100. Hint: raise the bound, or serve a prefix "
        "holding fewer models (--exit-on-error true)" in log
    )


def test_a_bucket_that_cannot_be_reached_at_start_up_ends_the_start(bucket, tmp_path):
    url = f"s3://127.0.0.1:{free_port()}/{bucket}/repo"  # nothing listens there
    log = failed_start(url, tmp_path)
    assert f"exiting: {url}: cannot read the repository: EndpointConnectionError: " in log
    assert SECRET_KEY not in log


def test_a_bad_url_is_refused_before_the_server_starts_as_the_page_shows():
    page = (REPO_ROOT / "docs" / "object-storage.md").read_text()
    example = page.split("```console\n$ reposerve ")[1].split("\n```")[0]
    arguments, said = example.split("\n")
    done = subprocess.run(
        [sys.executable, "-m", "reposerve", *arguments.split()],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == said


def test_an_azure_container_serves_through_azurite(tmp_path, monkeypatch):
    azurite = AzuriteServer(tmp_path)
    try:
        folder = write_model(
            tmp_path / "staging", "add", vector_config(size=1), ADD.format(amount=2)
        )
        azurite.upload_folder("models", "repo/add", folder)
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
        with running_server(
            "az://models/repo",
            tmp_path,
            "--repository-cache-dir", str(tmp_path / "cache"),
        ) as server:  # fmt: skip
            assert answer(server, "add") == 2.0
        assert AZURITE_KEY not in server.log()
    finally:
        azurite.stop()


def test_an_explicit_load_from_a_bucket_out_of_reach_fails_and_the_model_serves_on(
    moto, bucket, tmp_path
):
    put_model(moto, bucket, tmp_path, "add", amount=1)
    relay = CuttingRelay(moto.port)
    url = f"s3://127.0.0.1:{relay.port}/{bucket}/repo"
    with running_server(
        url,
        tmp_path,
        "--repository-cache-dir", str(tmp_path / "cache"),
        "--model-control-mode", "explicit",
        "--load-model", "add",
    ) as server:  # fmt: skip
        relay.close()  # the network to the bucket is gone
        response = httpx.post(f"{server.url}/v2/repository/models/add/load", timeout=120)
        assert response.status_code == 503
        error = response.json()["error"]
        assert error.startswith(f"failed to load 'add': {url}: cannot read the repository: ")
        assert error.endswith("The last copy pulled keeps serving")
        assert answer(server, "add") == 1.0
    assert SECRET_KEY not in server.log()


def test_a_restart_with_the_bucket_out_of_reach_serves_the_cache_when_told_to(
    moto, bucket, tmp_path
):
    put_model(moto, bucket, tmp_path, "add", amount=1)
    relay = CuttingRelay(moto.port)
    url = f"s3://127.0.0.1:{relay.port}/{bucket}/repo"
    arguments = ("--repository-cache-dir", str(tmp_path / "cache"))
    with running_server(url, tmp_path, *arguments):
        pass
    relay.close()
    with running_server(url, tmp_path, *arguments, "--exit-on-error", "false") as server:
        assert answer(server, "add") == 1.0
        assert f"{url}: cannot read the repository: " in server.log()
        assert "; serving the copies in the cache" in server.log()
