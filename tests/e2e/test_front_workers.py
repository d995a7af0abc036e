"""Front processes (--http-workers / --grpc-workers 2): the server's own process is front
0, a second process front 1, one port each protocol, one set of schedulers behind both.

A connection's front is found by asking: an operation through front 1 moves its
``reposerve_front_calls_total{front="1"}``, one through front 0 does not. Each test then
talks to each front on a connection pinned to it.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from reposerve.fronts import max_workers, usable_cores
from tests.server import (
    Server,
    front_calls,
    pinned_clients,
    running_server,
    self_signed_certificate,
    start_server,
)
from tests.toy_models import (
    COUNTING_SYNC,
    PLUS_ONE,
    counting_config,
    vector_body,
    vector_config,
    write_model,
)
from tools.bench.servers import children_of

pytestmark = pytest.mark.e2e

TWO_FRONTS = ("--http-workers", "2", "--grpc-workers", "2")
# Batches wait up to 2 s for a second request: two requests sent together share one.
PAIRED = vector_config(
    size=4,
    extra="""
    [dynamic_batching]
    preferred_batch_size = [2]
    max_queue_delay_microseconds = 2000000
    """,
)
SLOW = """
    import time

    class Model:
        def execute(self, inputs):
            time.sleep(1.0)
            return {"OUTPUT": inputs["INPUT"] + 1}
"""


def metric(server: Server, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, text
    return float(found[1])


def pinned_grpc(server: Server, front: int) -> grpcclient.InferenceServerClient:
    for _ in range(60):
        client = grpcclient.InferenceServerClient(server.grpc_address)
        before = front_calls(server)
        assert client.is_server_ready()
        if (front_calls(server) > before) == (front == 1):
            return client
        client.close()
    raise AssertionError(f"no gRPC connection landed on front {front}")


def worker_pids(server: Server) -> list[int]:
    return [
        pid
        for pid in children_of(server.process.pid)
        if b"reposerve.fronts.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def wait_for(predicate, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def fronts(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fronts")
    repository = root / "repository"
    write_model(repository, "paired", PAIRED, PLUS_ONE)
    write_model(repository, "plus_one", vector_config(size=4), PLUS_ONE)
    log = root / "count.log"
    write_model(repository, "count", counting_config(log), COUNTING_SYNC)
    server = start_server(repository, root, *TWO_FRONTS)
    try:
        clients = pinned_clients(server)
    except BaseException:  # no server left running into the next tests
        server.stop()
        raise
    yield server, clients, log
    for client in clients.values():
        client.close()
    assert server.stop() == 0, server.log()


def test_the_start_up_log_says_how_many_fronts_serve(fronts):
    server, _, _ = fronts
    assert "fronts: HTTP 2 processes, gRPC 2 processes" in server.log()
    (front,) = worker_pids(server)
    # Its own session: a signal to the server's process group (Ctrl-C) is the server's.
    assert os.getsid(front) != os.getsid(server.process.pid)


def test_requests_from_two_fronts_share_one_batch(fronts):
    server, clients, _ = fronts
    before = clients[0].get("/v2/models/paired/stats").json()["model_stats"][0]
    with ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(
                lambda front: clients[front].post(
                    "/v2/models/paired/infer", json=vector_body(float(front))
                ),
                (0, 1),
            )
        )
    for front, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [front + 1.0, 2.0, 3.0, 4.0]
    after = clients[1].get("/v2/models/paired/stats").json()["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 2
    assert after["execution_count"] - before["execution_count"] == 1  # one batch of two


def test_metrics_and_statistics_count_the_requests_of_every_front(fronts):
    server, clients, _ = fronts
    name = 'nv_inference_request_success{model="plus_one",version="1"}'
    before = metric(server, name)
    for front, count in ((0, 3), (1, 5)):
        for _ in range(count):
            answer = clients[front].post("/v2/models/plus_one/infer", json=vector_body(1.0))
            assert answer.status_code == 200, answer.text
    assert metric(server, name) - before == 8
    for client in clients.values():  # both fronts answer the one set of statistics
        stats = client.get("/v2/models/plus_one/stats").json()["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == metric(server, name)


def test_errors_through_a_front_are_the_servers_own(fronts):
    _, clients, _ = fronts
    for client in clients.values():
        missing = client.post("/v2/models/nope/infer", json=vector_body(1.0))
        assert missing.status_code == 404
        assert "nope" in missing.json()["error"]
        bad = client.post("/v2/models/plus_one/infer", content=b"{not json")
        assert bad.status_code == 400
        assert "malformed request JSON" in bad.json()["error"]
        assert client.get("/v2/models/plus_one/config").json()["max_batch_size"] == 8
        assert client.get("/v2/health/ready").status_code == 200


def test_an_unload_and_a_load_through_one_front_are_seen_by_the_other(fronts):
    _, clients, _ = fronts
    for actor, watcher in ((1, 0), (0, 1)):
        answer = clients[actor].post("/v2/repository/models/plus_one/unload")
        assert answer.status_code == 200, answer.text
        assert clients[watcher].get("/v2/models/plus_one/ready").status_code == 400
        refused = clients[watcher].post("/v2/models/plus_one/infer", json=vector_body(1.0))
        assert refused.status_code in (400, 404, 503), refused.text
        answer = clients[actor].post("/v2/repository/models/plus_one/load")
        assert answer.status_code == 200, answer.text
        assert clients[watcher].get("/v2/models/plus_one/ready").status_code == 200
        served = clients[watcher].post("/v2/models/plus_one/infer", json=vector_body(1.0))
        assert served.status_code == 200, served.text


def test_a_stream_through_the_second_front_carries_every_response(fronts):
    _, clients, _ = fronts
    with clients[1].stream(
        "POST",
        "/v2/models/count/generate_stream",
        json={"COUNT": 20, "DELAY": 0.0, "SIZE": 100_000},
    ) as reply:
        assert reply.status_code == 200
        events = [msgspec.json.decode(line[len("data: ") :]) for line in reply.iter_lines() if line]
    assert [event["OUT"] for event in events] == list(range(20))
    assert all(len(event["BLOB"]) == 100_000 for event in events)


def test_a_client_leaving_a_stream_on_the_second_front_stops_the_generation(fronts):
    server, _, log = fronts
    log.unlink(missing_ok=True)
    client = pinned_grpc(server, 1)
    received = []
    done = threading.Event()

    def callback(result, error) -> None:
        received.append(error)
        if len(received) >= 3:
            done.set()

    client.start_stream(callback=callback)
    inputs = []
    for name, datatype, value in (
        ("COUNT", "INT32", np.array([1000], np.int32)),
        ("DELAY", "FP32", np.array([0.02], np.float32)),
        ("SIZE", "INT32", np.array([1], np.int32)),
    ):
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    client.async_stream_infer("count", inputs, request_id="long")
    assert done.wait(20), received
    assert all(error is None for error in received[:3])
    client.stop_stream(cancel_requests=True)
    client.close()
    assert wait_for(lambda: log.exists() and "cancelled" in log.read_text().split())
    assert log.read_text().split().count("yield") < 100


def test_an_sse_client_leaving_the_second_front_stops_the_generation(fronts):
    """(Last of the tests on the shared server: it closes its connection to front 1.)"""
    _, clients, log = fronts
    log.unlink(missing_ok=True)
    body = {"COUNT": 1000, "DELAY": 0.02, "SIZE": 1}
    with clients[1].stream("POST", "/v2/models/count/generate_stream", json=body) as reply:
        assert reply.status_code == 200
        events = (line for line in reply.iter_lines() if line)
        assert [next(events) for _ in range(3)]
    assert wait_for(lambda: log.exists() and "cancelled" in log.read_text().split())
    assert log.read_text().split().count("yield") < 100


@pytest.mark.parametrize(("flags", "version"), [(["--http2"], "HTTP/2"), ([], "HTTP/1.1")])
def test_tls_through_every_front(repository, tmp_path, flags, version):
    cert, key = self_signed_certificate(tmp_path)
    write_model(repository, "plus_one", vector_config(size=4), PLUS_ONE)
    tls = ("--ssl-certfile", cert, "--ssl-keyfile", key)
    with running_server(repository, tmp_path, *TWO_FRONTS, *flags, *tls) as server:
        trusted = ssl.create_default_context(cafile=cert)
        fronts_seen = set()
        for _ in range(40):  # new connections until both fronts answered one
            before = front_calls(server)
            with httpx.Client(http2=True, verify=trusted) as client:
                answer = client.post(
                    f"{server.url}/v2/models/plus_one/infer", json=vector_body(1.0)
                )
            assert answer.http_version == version
            assert answer.json()["outputs"][0]["data"] == [2.0, 2.0, 3.0, 4.0]
            fronts_seen.add(int(front_calls(server) > before))
            if len(fronts_seen) == 2:
                break
        assert fronts_seen == {0, 1}


def test_a_killed_front_costs_only_its_own_connections_and_is_replaced(repository, tmp_path):
    write_model(repository, "plus_one", vector_config(size=4), PLUS_ONE)
    with running_server(repository, tmp_path, *TWO_FRONTS) as server:
        clients = pinned_clients(server)
        stop = threading.Event()
        outcomes: dict[int, list[int | str]] = {0: [], 1: []}

        def load(front: int) -> None:
            while not stop.is_set():
                try:
                    answer = clients[front].post("/v2/models/plus_one/infer", json=vector_body(2.0))
                    outcomes[front].append(answer.status_code)
                except httpx.TransportError as exc:
                    outcomes[front].append(type(exc).__name__)
                    return

        threads = [threading.Thread(target=load, args=(front,)) for front in (0, 1)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        (victim,) = worker_pids(server)
        os.kill(victim, signal.SIGKILL)
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert outcomes[0] and set(outcomes[0]) == {200}, outcomes[0][-5:]
        # Its own connection broke with it (or, idle at that moment, was replaced by the
        # client): never an error status from the server.
        assert all(outcome == 200 or isinstance(outcome, str) for outcome in outcomes[1])
        assert wait_for(lambda: worker_pids(server) not in ([], [victim]))
        assert wait_for(lambda: metric(server, "reposerve_front_restarts_total") == 1)
        for client in clients.values():
            client.close()
        replaced = pinned_clients(server)  # the new front serves
        answer = replaced[1].post("/v2/models/plus_one/infer", json=vector_body(2.0))
        assert answer.status_code == 200, answer.text
        for client in replaced.values():
            client.close()
    assert "exited (killed by signal 9)" in server.log()


def test_sigterm_answers_what_every_front_accepted_and_every_process_exits(repository, tmp_path):
    write_model(repository, "slow", vector_config(size=4, max_batch=0), SLOW)
    server = start_server(repository, tmp_path, *TWO_FRONTS, "--exit-timeout-secs", "20")
    clients = pinned_clients(server)
    fronts = worker_pids(server)
    try:
        body = {
            "inputs": [{"name": "INPUT", "shape": [4], "datatype": "FP32", "data": [1.0, 2, 3, 4]}]
        }
        with ThreadPoolExecutor(4) as pool:
            sent = [
                pool.submit(clients[front].post, "/v2/models/slow/infer", json=body)
                for front in (0, 1)
            ]
            time.sleep(0.3)  # both accepted and running or queued
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            answers = [future.result(timeout=30) for future in sent]
        assert [answer.status_code for answer in answers] == [200, 200], [
            answer.text for answer in answers
        ]
        assert server.process.wait(30) == 0, server.log()
        assert time.monotonic() - started < 20
        assert all(not Path(f"/proc/{pid}").exists() for pid in fronts)
    finally:
        for client in clients.values():
            client.close()
        server.stop()


def _marked(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (the server's, and so its
    fronts', wherever they were reparented)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours
                continue
    return found


def test_sigterm_while_the_fronts_start_leaves_no_front_behind(repository, tmp_path, monkeypatch):
    """The signal comes as the first front is up, the others starting: the server exits
    cleanly and not one front outlives it (each is a process of its own session). That
    no more start once the signal came is shown without racing a signal in
    tests/integration/test_front_lifecycle.py."""
    write_model(repository, "plus_one", vector_config(size=4), PLUS_ONE)
    marker = f"REPOSERVE_TEST_RUN={os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv(*marker.split("=", 1))  # inherited by the server and its fronts
    count = str(min(8, max_workers(usable_cores())))
    server = Server(
        repository,
        *("--http-workers", count, "--grpc-workers", count),
        log_path=tmp_path / "server.log",
    )
    try:
        assert wait_for(lambda: len(_marked(marker)) > 1, 60), server.log()  # a front is up
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(60) == 0, server.log()
        assert _marked(marker) == []
    finally:
        server.stop()


def test_in_the_shutdown_grace_every_front_says_not_ready_and_still_serves(repository, tmp_path):
    write_model(repository, "plus_one", vector_config(size=4), PLUS_ONE)
    server = start_server(repository, tmp_path, *TWO_FRONTS, "--shutdown-grace-secs", "4")
    clients = pinned_clients(server)
    try:
        server.process.send_signal(signal.SIGTERM)
        for client in clients.values():
            assert wait_for(lambda c=client: c.get("/v2/health/ready").status_code == 503)
            answer = client.post("/v2/models/plus_one/infer", json=vector_body(1.0))
            assert answer.status_code == 200, answer.text
        assert server.process.wait(30) == 0, server.log()
    finally:
        for client in clients.values():
            client.close()
        server.stop()


def test_fronts_serve_only_the_protocols_that_are_on(repository, tmp_path):
    write_model(repository, "plus_one", vector_config(size=4), PLUS_ONE)
    flags = (*TWO_FRONTS, "--allow-grpc", "false")
    with running_server(repository, tmp_path, *flags) as server:
        clients = pinned_clients(server)
        (front,) = worker_pids(server)
        time.sleep(1.5)  # a front that cannot start would have been replaced by now
        assert worker_pids(server) == [front]
        assert metric(server, "reposerve_front_restarts_total") == 0
        answer = clients[1].post("/v2/models/plus_one/infer", json=vector_body(1.0))
        assert answer.status_code == 200, answer.text
        for client in clients.values():
            client.close()
    assert "fronts: HTTP 2 processes (" in server.log()
