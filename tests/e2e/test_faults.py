"""A fault costs one request, never its neighbours: bad items inside a batch, hung models
with and without an execution timeout, unloads and SIGTERM with requests queued behind a
hung execute, crash loops, readiness, and repository control hygiene. Every test counts
what was sent against what was answered."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.probes import metric, stats, wait_for
from tests.server import REPO_ROOT, Server, running_server, start_server
from tests.toy_models import (
    CRASH_LOOP,
    DEVICE_FAULTS,
    HANGS,
    PICKY,
    PLUS_ONE,
    SLOW_RESTART,
    SLOW_TEARDOWN,
    vector_body,
    vector_config,
    write_model,
)

pytestmark = pytest.mark.e2e

BATCH_OF_8 = """
    [dynamic_batching]
    preferred_batch_size = [8]
    max_queue_delay_microseconds = 2000000
"""


def _post_all(url: str, bodies: list[dict], timeout: float = 60) -> list[httpx.Response]:
    """Send every body at once, each on its own connection; every response, in order."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: httpx.post(url, json=body, timeout=timeout), bodies))


# -- a bad item in a batch ---------------------------------------------------------------


@pytest.fixture(scope="module")
def picky_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    write_model(root, "picky", vector_config(size=4, extra=BATCH_OF_8), PICKY)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize(
    ("bad", "status", "message"),
    [
        (-1, 400, "an item starts with -1, which this model cannot read"),
        (-2, 500, "ValueError: an item starts with -2"),
    ],
)
def test_one_bad_item_fails_alone_and_the_seven_others_get_exact_results(
    picky_server, bad, status, message
):
    before = stats(picky_server, "picky")["isolation_stats"]
    firsts = [float(bad) if i == 5 else float(10 * i) for i in range(8)]
    responses = _post_all(
        f"{picky_server.url}/v2/models/picky/infer", [vector_body(f) for f in firsts]
    )
    assert len(responses) == 8
    for i, (first, response) in enumerate(zip(firsts, responses, strict=True)):
        if i == 5:
            assert response.status_code == status
            # The model's own words about the client's data reach it verbatim (Triton's
            # rule); an exception is named with the model and version that raised it.
            expected = message if status == 400 else f"model 'picky' version 1: {message}"
            assert response.json() == {"error": expected}
        else:
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"] == [first + 1, 2.0, 3.0, 4.0]
    after = stats(picky_server, "picky")
    # They were one batch of eight, which failed and was isolated: 8 -> 4 -> 2 -> 1.
    assert after["isolation_stats"]["batches"] == before["batches"] + 1
    assert after["isolation_stats"]["failed_requests"] == before["failed_requests"] + 1
    assert after["isolation_stats"]["executions"] == before["executions"] + 6
    assert metric(picky_server, "reposerve_isolated_batch_count", "picky") >= 1


def test_tritonclient_sees_the_bad_input_as_a_400(picky_server):
    client = httpclient.InferenceServerClient(picky_server.address)
    tensor = httpclient.InferInput("INPUT", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([[-1, 0, 0, 0]], np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("picky", [tensor])
    assert caught.value.status() == "400"
    assert "this model cannot read" in caught.value.message()
    client.close()


# -- hung models -------------------------------------------------------------------------


def test_a_hung_execute_past_its_timeout_fails_alone_and_the_queue_is_served(repository, tmp_path):
    config = vector_config(size=4, extra="[execution]\ntimeout_seconds = 2")
    folder = write_model(repository, "hangs", config, HANGS)
    with running_server(repository, tmp_path) as server:
        url = f"{server.url}/v2/models/hangs/infer"
        (first_pid,) = server.instance_pids()
        with ThreadPoolExecutor(4) as pool:
            hung = pool.submit(httpx.post, url, json=vector_body(13), timeout=60)
            # The hung one holds the only instance; these queue behind it.
            wait_for((folder / "1" / "HANGING").exists, what="the model to hang")
            queued = [
                pool.submit(httpx.post, url, json=vector_body(i), timeout=60) for i in (1, 2, 3)
            ]
            answers = [hung.result(), *(f.result() for f in queued)]
        assert answers[0].status_code == 500
        assert answers[0].json() == {
            "error": "model 'hangs' version 1: execute did not finish within 2 s "
            "(execution.timeout_seconds); the instance was killed and is being replaced"
        }
        for first, response in zip((1, 2, 3), answers[1:], strict=True):
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"][0] == first
        (second_pid,) = server.instance_pids()
        assert second_pid != first_pid
        assert metric(server, "nv_inference_pending_request_count", "hangs") == 0
        # Kills for hung requests are no crash loop (5 deaths would be): it keeps restarting.
        for _ in range(4):
            hung = httpx.post(url, json=vector_body(13), timeout=60)
            assert hung.status_code == 500 and "execution.timeout_seconds" in hung.text
            wait_for(lambda: httpx.get(f"{server.url}/v2/models/hangs/ready").status_code == 200)
        assert httpx.post(url, json=vector_body(5)).json()["outputs"][0]["data"][0] == 5


# -- device errors -----------------------------------------------------------------------


def test_a_cuda_error_replaces_its_instance_and_out_of_memory_does_not(repository, tmp_path):
    config = vector_config(size=4, extra="[[instance_group]]\ncount = 2")
    write_model(repository, "device", config, DEVICE_FAULTS)
    server = start_server(repository, tmp_path)
    url = f"{server.url}/v2/models/device/infer"
    try:
        pids = set(server.instance_pids())
        oom = httpx.post(url, json=vector_body(-8))
        assert oom.status_code == 500
        assert "OutOfMemoryError: CUDA out of memory" in oom.json()["error"]
        assert set(server.instance_pids()) == pids  # out of memory: it carries on
        for _ in range(6):  # past the crash loop's 5: each was one batch's fault
            poisoned = httpx.post(url, json=vector_body(-7), timeout=60)
            assert poisoned.status_code == 500
            error = poisoned.json()["error"]
            assert error.startswith(
                "model 'device' version 1: RuntimeError: CUDA error: device-side assert"
            )
            assert error.endswith("the instance is being replaced)")
            # The poisoned instance takes nothing more: 20 requests at once right after.
            answers = _post_all(url, [vector_body(i) for i in range(20)])
            assert [response.status_code for response in answers] == [200] * 20
            answered_by = {int(r.json()["outputs"][0]["data"][0]) for r in answers}
            wait_for(
                lambda old=pids: len(set(server.instance_pids()) - old) == 1, what="a replacement"
            )
            now = set(server.instance_pids())
            (dead,) = pids - now
            (replacement,) = now - pids
            assert dead not in answered_by
            pids = now
            # Both serve again before the next round (rotation alternates between them).
            wait_for(lambda new=replacement: _answered_by(url) == new, what="the replacement")
        assert metric(server, "reposerve_instance_restart_count", "device") == 6
    finally:
        assert server.stop() == 0, server.log()


def test_a_slow_teardown_does_not_stall_other_clients(repository, tmp_path):
    folder = write_model(repository, "slow_exit", vector_config(size=4), SLOW_TEARDOWN)
    write_model(repository, "other", vector_config(size=4), PLUS_ONE)
    with running_server(repository, tmp_path, "--exit-timeout-secs", "60") as server:
        url = f"{server.url}/v2/models/other/infer"
        with ThreadPoolExecutor(1) as pool:
            unload = pool.submit(
                httpx.post, f"{server.url}/v2/repository/models/slow_exit/unload", timeout=90
            )
            wait_for((folder / "1" / "TEARDOWN").exists, what="the teardown to begin")
            # The teardown lasts until GO: everyone else is served meanwhile.
            for _ in range(10):
                assert httpx.post(url, json=vector_body(1), timeout=30).status_code == 200
            assert not unload.done()  # the unload waits for the teardown
            (folder / "1" / "GO").touch()
            assert unload.result().status_code == 200


def _answered_by(url: str) -> int:
    return int(httpx.post(url, json=vector_body(1)).json()["outputs"][0]["data"][0])


def _hung_with_queue(server: Server, folder: Path, pool: ThreadPoolExecutor, queued: int = 4):
    url = f"{server.url}/v2/models/hangs/infer"
    futures = [pool.submit(httpx.post, url, json=vector_body(13), timeout=60)]
    wait_for((folder / "1" / "HANGING").exists, what="the model to hang")
    futures += [
        pool.submit(httpx.post, url, json=vector_body(i), timeout=60) for i in range(queued)
    ]
    wait_for(
        lambda: metric(server, "nv_inference_pending_request_count", "hangs") == queued,
        what="requests queued behind the hung one",
    )
    return futures


BUDGET_S = 4  # --exit-timeout-secs of the servers with a model that hangs for good


def _serve_hangs(repository: Path, tmp_path: Path, *flags: str) -> tuple[Server, Path]:
    """A server with a model that hangs for good (no execution timeout), budget BUDGET_S."""
    config = vector_config(size=4, extra="[execution]\ntimeout_seconds = 0")
    folder = write_model(repository, "hangs", config, HANGS)
    budget = str(BUDGET_S)
    return start_server(repository, tmp_path, "--exit-timeout-secs", budget, *flags), folder


def test_unloading_a_hung_model_answers_every_request_within_the_budget(repository, tmp_path):
    server, folder = _serve_hangs(repository, tmp_path)
    try:
        with ThreadPoolExecutor(8) as pool:
            futures = _hung_with_queue(server, folder, pool)
            unload = httpx.post(f"{server.url}/v2/repository/models/hangs/unload", timeout=30)
            answers = [future.result() for future in futures]
        assert unload.status_code == 200
        assert len(answers) == 5
        for response in answers:
            assert response.status_code == 503
            assert response.headers["content-type"] == "application/json"
            assert response.json() == {
                "error": "model 'hangs' version 1 was unloaded before this request finished "
                "(the unload budget, --exit-timeout-secs, ran out)"
            }
        assert metric(server, "nv_inference_pending_request_count", "hangs") == 0
        assert server.instance_pids() == []
        after = httpx.post(f"{server.url}/v2/models/hangs/infer", json=vector_body(1))
        assert after.status_code == 404
        assert after.json()["error"] == (
            "Request for unknown model: 'hangs' has no available versions (UNAVAILABLE): unloaded"
        )
    finally:
        assert server.stop() == 0, server.log()


def test_reloading_a_hung_model_answers_the_old_queue_and_serves_the_new(repository, tmp_path):
    server, folder = _serve_hangs(repository, tmp_path)
    try:
        with ThreadPoolExecutor(8) as pool:
            futures = _hung_with_queue(server, folder, pool, queued=3)
            (folder / "1" / "model.py").write_text(textwrap.dedent(PLUS_ONE))
            load = httpx.post(f"{server.url}/v2/repository/models/hangs/load", timeout=30)
            answers = [future.result() for future in futures]
        assert load.status_code == 200, load.text
        assert len(answers) == 4
        for response in answers:
            assert response.status_code == 503
            assert "was unloaded before this request finished" in response.json()["error"]
        served = httpx.post(f"{server.url}/v2/models/hangs/infer", json=vector_body(13))
        assert served.json()["outputs"][0]["data"][0] == 14  # the new code, + 1
        assert metric(server, "nv_inference_pending_request_count", "hangs") == 0
    finally:
        assert server.stop() == 0, server.log()


def test_unload_while_the_only_instance_restarts_answers_the_queue_at_once(repository, tmp_path):
    folder = write_model(repository, "slow", vector_config(size=1), SLOW_RESTART)
    with running_server(repository, tmp_path, "--exit-timeout-secs", "20") as server:
        (folder / "1" / "SLOW_LOAD").touch()
        url = f"{server.url}/v2/models/slow/infer"
        with ThreadPoolExecutor(4) as pool:
            dying = pool.submit(httpx.post, url, json=vector_body(666, size=1), timeout=60)
            wait_for((folder / "1" / "DYING").exists, what="the instance to start dying")
            queued = [pool.submit(httpx.post, url, json=vector_body(1, size=1), timeout=60)]
            queued.append(pool.submit(httpx.post, url, json=vector_body(2, size=1), timeout=60))
            wait_for(lambda: metric(server, "nv_inference_pending_request_count", "slow") == 2)
            assert "exited with code 3" in dying.result().text
            wait_for(lambda: httpx.get(f"{url[:-6]}/ready").status_code == 400)
            unload = httpx.post(f"{server.url}/v2/repository/models/slow/unload", timeout=60)
            answers = [future.result() for future in queued]
        assert unload.status_code == 200
        for response in answers:
            assert response.status_code == 503
            assert response.json() == {
                "error": "model 'slow' version 1 was unloaded before this request finished "
                "(no instance was running)"
            }


@pytest.mark.parametrize("http_server", ["uvicorn", "hypercorn"])
def test_sigterm_with_a_hung_model_answers_every_request_and_exits_0_in_budget(
    repository, tmp_path, http_server
):
    server, folder = _serve_hangs(repository, tmp_path, "--http-server", http_server)
    instances = server.instance_pids()
    with ThreadPoolExecutor(8) as pool:
        futures = _hung_with_queue(server, folder, pool)
        code = server.stop()
        answers = [future.result() for future in futures]
    assert code == 0, server.log()
    assert len(answers) == 5
    for response in answers:
        assert response.status_code == 503
        assert "was unloaded before this request finished" in response.json()["error"]
    assert not any(Path(f"/proc/{pid}").exists() for pid in instances)


# -- crash loops and readiness -----------------------------------------------------------


def test_a_crash_loop_ends_unavailable_with_its_reason(repository, tmp_path):
    folder = write_model(repository, "loops", vector_config(size=1), CRASH_LOOP)
    write_model(repository, "steady", vector_config(size=1), PLUS_ONE)
    with running_server(repository, tmp_path) as server:
        client = httpclient.InferenceServerClient(server.address)
        assert client.is_server_ready() and client.is_model_ready("loops")
        (folder / "1" / "CRASH_ON_LOAD").touch()
        killing = httpx.post(f"{server.url}/v2/models/loops/infer", json=vector_body(666, size=1))
        assert killing.status_code == 500 and "exited with code 3" in killing.text
        # Restarting: not ready while no instance lives, and the server is not either.
        wait_for(lambda: not client.is_model_ready("loops"), what="model not ready")
        reason = (
            "instance 0 died 5 times within 60 s (last: model 'loops' version 1 instance 0 "
            "(cpu): exited with code 4 while loading (Stub process 'loops_0_0' is not "
            "healthy.)); it is not restarted again. Fix the model and load it again"
        )
        index = {}

        def given_up() -> bool:
            index.update({e["name"]: e for e in client.get_model_repository_index()})
            return index["loops"]["state"] == "UNAVAILABLE"

        wait_for(given_up, what="the crash loop to end")
        assert index["loops"]["reason"] == reason
        assert not client.is_model_ready("loops")
        assert not client.is_server_ready()  # --strict-readiness, Triton's default
        assert metric(server, "reposerve_model_ready", "loops") == 0
        assert metric(server, "reposerve_model_ready", "steady") == 1
        assert metric(server, "reposerve_instance_restart_count", "loops") == 5
        assert reason in server.log()
        gone = httpx.post(f"{server.url}/v2/models/loops/infer", json=vector_body(1, size=1))
        assert gone.status_code == 404 and reason in gone.json()["error"]
        steady = httpx.post(f"{server.url}/v2/models/steady/infer", json=vector_body(1, size=1))
        assert steady.json()["outputs"][0]["data"] == [2.0]
        # Fixed on disk and loaded again: it serves, and the server is ready again.
        (folder / "1" / "CRASH_ON_LOAD").unlink()
        client.load_model("loops")
        assert client.is_model_ready("loops") and client.is_server_ready()
        client.close()


def test_exit_on_error_and_strict_readiness_follow_triton(repository, tmp_path):
    write_model(repository, "fine", vector_config(size=1), PLUS_ONE)
    write_model(repository, "broken", vector_config(size=1), "raise ImportError('no such lib')\n")
    # Triton's defaults: a model that fails at start-up fails the start.
    exiting = subprocess.run(
        [sys.executable, "-m", "reposerve", "--model-repository", str(repository),
         "--http-port", "0", "--metrics-port", "0", "--grpc-port", "0",
         "--http-host", "127.0.0.1"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
    )  # fmt: skip
    assert exiting.returncode == 1, exiting.stderr
    assert "exiting: broken failed to load (--exit-on-error true" in exiting.stderr
    # Serving the rest: not ready while a model is broken, unless readiness is not strict.
    strict = Server(repository, "--exit-on-error", "false", log_path=tmp_path / "strict.log")
    relaxed = start_server(repository, tmp_path, "--exit-on-error", "false",
                           "--strict-readiness", "false")  # fmt: skip
    try:
        wait_for(lambda: "ready: serving" in strict.log(), what="start-up")
        assert httpx.get(f"{strict.url}/v2/health/ready").status_code == 503
        assert httpx.get(f"{relaxed.url}/v2/health/ready").status_code == 200
        # Unloading the broken model on purpose makes the strict server ready.
        httpx.post(f"{strict.url}/v2/repository/models/broken/unload").raise_for_status()
        assert httpx.get(f"{strict.url}/v2/health/ready").status_code == 200
    finally:
        assert strict.stop() == 0, strict.log()
        assert relaxed.stop() == 0, relaxed.log()


# -- repository control hygiene ----------------------------------------------------------


def test_bogus_loads_leave_no_trace_and_unknown_models_are_4xx(repository, tmp_path):
    write_model(repository, "fine", vector_config(size=1), PLUS_ONE)
    (repository / "not_a_model.txt").write_text("hello")
    with running_server(repository, tmp_path) as server:
        index_url = f"{server.url}/v2/repository/index"
        before = httpx.post(index_url).json()
        with httpx.Client(base_url=server.url) as http:
            for i in range(200):
                name = ("nope", "not_a_model.txt", ".hidden", "bad%20name", f"ghost{i}")[i % 5]
                response = http.post(f"/v2/repository/models/{name}/load")
                assert response.status_code == 400, response.text
                assert "no such model folder" in response.json()["error"] or (
                    "not a valid model name" in response.json()["error"]
                )
        assert httpx.post(index_url).json() == before
        nested = b"[" * 100_000 + b"]" * 100_000
        for path in ("/v2/repository/index", "/v2/repository/models/fine/load"):
            response = httpx.post(f"{server.url}{path}", content=nested)
            assert response.status_code == 400, response.text
            assert "malformed request JSON" in response.json()["error"]
        unknown = httpx.post(f"{server.url}/v2/repository/models/ghost/unload")
        assert unknown.status_code == 404
        assert unknown.json() == {"error": "unload: unknown model 'ghost'"}
        missing = httpx.post(f"{server.url}/v2/models/ghost/infer", json=vector_body(1, size=1))
        assert missing.status_code == 404
        assert missing.json() == {"error": "Request for unknown model: 'ghost' is not found"}
