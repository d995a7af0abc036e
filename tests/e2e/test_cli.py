"""`reposerve check` and the serve flags that shape start-up."""

from __future__ import annotations

import ssl
import subprocess
import sys

import httpx
import msgspec
import pytest

from tests.server import REPO_ROOT, running_server, self_signed_certificate
from tests.toy_models import PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e


def _check(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reposerve", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )


def test_check_bundled_repository_is_clean():
    result = _check(REPO_ROOT / "model_repository")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   add_sub (versions 1; python)" in result.stdout.splitlines()


def test_check_help_says_how_to_use_it():
    result = _check("--help")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("usage: reposerve check [-h] [PATH ...]")


def test_check_prints_one_line_per_model(repository):
    write_model(repository, "good", vector_config(), PLUS_ONE)
    write_model(
        repository,
        "late",
        vector_config(extra="[dynamic_batching]\nmax_queue_delay_microseconds = -5"),
        PLUS_ONE,
    )
    write_model(repository, "empty", vector_config(), None)
    (repository / "empty" / "1").rmdir()
    result = _check(repository)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "FAIL empty: no version folders. Hint: put the model in empty/1/",
        "ok   good (versions 1; python)",
        "FAIL late/config.toml: dynamic_batching.max_queue_delay_microseconds: "
        "expected int >= 0, got -5",
    ]


def test_load_model_flag_and_explicit_control(repository, tmp_path):
    write_model(repository, "a", vector_config(), PLUS_ONE)
    write_model(repository, "b", vector_config(), PLUS_ONE)
    with running_server(repository, tmp_path, "--load-model", "a") as server:
        base = server.url
        assert httpx.get(f"{base}/v2/models/a/ready").status_code == 200
        assert httpx.get(f"{base}/v2/models/b/ready").status_code == 400
        index = httpx.post(f"{base}/v2/repository/index").json()
        assert {"name": "b"} in index
        assert httpx.post(f"{base}/v2/repository/models/b/load").status_code == 200
        assert httpx.get(f"{base}/v2/models/b/ready").status_code == 200
        assert httpx.post(f"{base}/v2/repository/models/a/unload").status_code == 200
        assert httpx.get(f"{base}/v2/models/a/ready").status_code == 400
        ready = httpx.post(f"{base}/v2/repository/index", json={"ready": True}).json()
        assert ready == [{"name": "b", "version": "1", "state": "READY"}]


def test_explicit_mode_loads_no_model_without_load_model(repository, tmp_path):
    """Triton's --model-control-mode=explicit: only --load-model ones load at start-up, so
    a model that cannot load does not stop the server even with --exit-on-error true."""
    write_model(repository, "a", vector_config(), PLUS_ONE)
    (repository / "broken").mkdir()
    (repository / "broken" / "config.toml").write_text("max_batch_size = -1\n")
    with running_server(
        repository, tmp_path, "--model-control-mode=explicit", "--exit-on-error", "true"
    ) as server:
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        assert index == [{"name": "a"}, {"name": "broken"}]
        assert httpx.post(f"{server.url}/v2/repository/models/a/load").status_code == 200
        assert httpx.get(f"{server.url}/v2/models/a/ready").status_code == 200


def test_restricted_control_api_needs_its_header(repository, tmp_path):
    write_model(repository, "a", vector_config(), PLUS_ONE)
    with running_server(
        repository, tmp_path, "--http-restricted-api", "model-repository:admin-key=s3cret"
    ) as server:
        response = httpx.post(f"{server.url}/v2/repository/models/a/unload")
        assert response.status_code == 403
        assert response.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
        response = httpx.post(
            f"{server.url}/v2/repository/models/a/unload", headers={"admin-key": "s3cret"}
        )
        assert response.status_code == 200


@pytest.mark.parametrize("http_server", ["uvicorn", "hypercorn"])
def test_both_http_servers_serve(repository, tmp_path, http_server):
    write_model(repository, "a", vector_config(size=2), PLUS_ONE)
    with running_server(repository, tmp_path, "--http-server", http_server) as server:
        response = httpx.post(
            f"{server.url}/v2/models/a/infer",
            json={
                "inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]
            },
        )
        assert response.json()["outputs"][0]["data"] == [2.0, 3.0]


def test_http2_on_hypercorn(repository, tmp_path):
    pytest.importorskip("h2", reason="httpx needs h2 for HTTP/2")
    write_model(repository, "a", vector_config(size=2), PLUS_ONE)
    with running_server(repository, tmp_path, "--http2") as server:
        with httpx.Client(http1=False, http2=True) as client:
            response = client.post(
                f"{server.url}/v2/models/a/infer",
                json={
                    "inputs": [
                        {"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
                    ]
                },
            )
        assert response.http_version == "HTTP/2"
        assert response.json()["outputs"][0]["data"] == [2.0, 3.0]


def test_bodies_past_the_input_limit_are_refused(repository, tmp_path):
    write_model(repository, "a", vector_config(size=2), PLUS_ONE)
    with running_server(repository, tmp_path, "--http-max-input-size", "200") as server:
        small = {"inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
        assert httpx.post(f"{server.url}/v2/models/a/infer", json=small).status_code == 200
        big = {"inputs": [dict(small["inputs"][0], parameters={"pad": "x" * 300})]}
        response = httpx.post(f"{server.url}/v2/models/a/infer", json=big)
        assert response.status_code == 400
        assert "exceeds the 200-byte limit (--http-max-input-size)" in response.json()["error"]

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"inputs": ['
            yield b" " * 300
            yield b"]}"

        response = httpx.post(f"{server.url}/v2/models/a/infer", content=chunks())
        assert response.status_code == 400
        assert "exceeds the 200-byte limit" in response.json()["error"]


def test_fixed_repository_and_json_logs(repository, tmp_path):
    write_model(repository, "a", vector_config(size=2), PLUS_ONE)
    with running_server(
        repository, tmp_path, "--model-control-mode", "none", "--log-format", "json"
    ) as server:
        response = httpx.post(f"{server.url}/v2/repository/models/a/unload")
        assert response.status_code == 400
        assert "not allowed with --model-control-mode none" in response.json()["error"]
        assert httpx.get(f"{server.url}/v2/models/a/ready").status_code == 200
    records = [msgspec.json.decode(line) for line in server.log().splitlines() if line]
    assert any(r["message"].startswith("ready: serving") for r in records)
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)


@pytest.mark.parametrize(("flags", "version"), [(["--http2"], "HTTP/2"), ([], "HTTP/1.1")])
def test_tls(repository, tmp_path, flags, version):
    cert, key = self_signed_certificate(tmp_path)
    write_model(repository, "a", vector_config(size=2), PLUS_ONE)
    with running_server(
        repository, tmp_path, *flags, "--ssl-certfile", cert, "--ssl-keyfile", key
    ) as server:
        assert server.url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(http2=True, verify=trusted) as client:
            body = {
                "inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]
            }
            response = client.post(f"{server.url}/v2/models/a/infer", json=body)
        assert response.http_version == version
        assert response.json()["outputs"][0]["data"] == [2.0, 3.0]
