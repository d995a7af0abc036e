"""A cluster on one machine: three replicas on one repository (poll mode) behind a small
load balancer that routes by readiness probes and retries a refused connection, as
Kubernetes' Service and an ingress do. Under steady load: a rolling restart (SIGTERM one
replica at a time, start its successor, wait until it is ready) and a model change that
every replica picks up. Not one request may fail. And replicas started with the arguments
of deploy/k8s's shared-repository component: a broken model folder on the shared volume
costs that model only, on every replica, and its repair is picked up by all."""

from __future__ import annotations

import itertools
import signal
import textwrap
import threading
import time

import httpx
import pytest

from tests.manifests import kustomize_commands, render, with_shared_repository
from tests.server import Server, start_server
from tests.toy_models import vector_config, write_model

pytestmark = [pytest.mark.e2e, pytest.mark.tool]

PLUS = """
    class Model:
        def execute(self, inputs):
            return {{"OUTPUT": inputs["INPUT"] + {step}}}
"""
BODY = {"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "FP32", "data": [0] * 16}]}
REPLICA_FLAGS = (
    "--model-control-mode", "poll", "--repository-poll-secs", "0.5",
    "--shutdown-grace-secs", "1.5",
)  # fmt: skip
PROBE_EVERY_S = 0.2  # a readiness probe's period (Kubernetes' is seconds; grace covers it)


class Balancer:
    """Round robin over the replicas its probes find ready; a connection refused or reset
    is retried on the next one (what a proxy does before it has sent a request)."""

    def __init__(self, replicas: list[Server]) -> None:
        self.replicas = list(replicas)
        self.in_rotation: list[Server] = list(replicas)
        self.answers: dict[float, int] = {}  # the value returned -> how many times
        self.failures: list[str] = []
        self.retries = 0
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self.running = threading.Event()
        self.running.set()

    def probe(self) -> None:
        while self.running.is_set():
            ready = []
            for replica in list(self.replicas):
                try:
                    if httpx.get(f"{replica.url}/v2/health/ready", timeout=1).status_code == 200:
                        ready.append(replica)
                except httpx.TransportError:
                    pass
            self.in_rotation = ready
            time.sleep(PROBE_EVERY_S)

    def client(self) -> None:
        with httpx.Client(timeout=10) as http:
            while self.running.is_set():
                self._send(http)

    def _send(self, http: httpx.Client) -> None:
        for _ in range(5):
            rotation = self.in_rotation
            if not rotation:
                time.sleep(0.05)
                continue
            replica = rotation[next(self._turn) % len(rotation)]
            try:
                reply = http.post(f"{replica.url}/v2/models/plus/infer", json=BODY)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                with self._lock:
                    self.retries += 1
                continue
            with self._lock:
                if reply.status_code == 200:
                    value = reply.json()["outputs"][0]["data"][0]
                    self.answers[value] = self.answers.get(value, 0) + 1
                else:
                    self.failures.append(f"{reply.status_code} {reply.text[:200]}")
            return
        with self._lock:
            self.failures.append("no replica took the request")


def test_a_rolling_restart_and_a_model_change_lose_no_request(repository, tmp_path):
    write_model(repository, "plus", vector_config(), textwrap.dedent(PLUS.format(step=1)))
    replicas = [start_server(repository, tmp_path, *REPLICA_FLAGS) for _ in range(3)]
    balancer = Balancer(replicas)
    workers = [threading.Thread(target=balancer.probe)]
    workers += [threading.Thread(target=balancer.client) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(1)
        for index, old in enumerate(list(replicas)):
            old.process.send_signal(signal.SIGTERM)
            assert old.process.wait(30) == 0, old.log()
            successor = start_server(repository, tmp_path, *REPLICA_FLAGS)
            balancer.replicas[index] = successor
            replicas.append(successor)
        # A new version of the model, on the shared repository: every replica polls it.
        (repository / "plus" / "1" / "model.py").write_text(textwrap.dedent(PLUS.format(step=2)))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seen = {
                httpx.post(f"{r.url}/v2/models/plus/infer", json=BODY).json()["outputs"][0]["data"][
                    0
                ]
                for r in balancer.replicas
            }
            if seen == {2.0}:
                break
            time.sleep(0.2)
        assert seen == {2.0}, seen
        time.sleep(1)
    finally:
        balancer.running.clear()
        for worker in workers:
            worker.join(30)
        for replica in replicas:
            replica.stop()
    answered = sum(balancer.answers.values())
    assert balancer.failures == [], balancer.failures[:5]
    # The grace period: each replica left the rotation before it stopped accepting.
    assert balancer.retries == 0
    assert answered > 100 and set(balancer.answers) == {1.0, 2.0}, balancer.answers
    print(f"cluster: {answered} answered, 0 failed, {balancer.retries} retried connections")


BROKEN = """
    raise ImportError("half-copied")
"""
# Where the test puts a replica, not what the manifest says: the rest of its arguments are
# the component's.
PLACEMENT_FLAGS = ("--model-repository", "--http-port", "--grpc-port", "--metrics-port")


def _component_flags(tmp_path) -> list[str]:
    kustomize = kustomize_commands()["kustomize"]
    if kustomize is None:
        pytest.skip("kustomize is not installed: run tools/install_deploy_tools.sh")
    documents = render(with_shared_repository(tmp_path, "cpu"), kustomize)
    (deployment,) = [document for document in documents if document["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    flags = [arg for arg in container["args"] if not arg.startswith(PLACEMENT_FLAGS)]
    return [*flags, "--repository-poll-secs=0.3"]  # the manifest's 15 s, shortened


def test_a_broken_model_on_the_shared_repository_costs_that_model_only(repository, tmp_path):
    write_model(repository, "plus", vector_config(), textwrap.dedent(PLUS.format(step=1)))
    write_model(repository, "half", vector_config(), textwrap.dedent(BROKEN))
    flags = _component_flags(tmp_path)
    # every replica starts and is ready although one model fails to load
    replicas = [start_server(repository, tmp_path, *flags) for _ in range(2)]
    try:
        for replica in replicas:
            answer = httpx.post(f"{replica.url}/v2/models/plus/infer", json=BODY)
            assert answer.json()["outputs"][0]["data"][0] == 1.0
            half = httpx.post(f"{replica.url}/v2/models/half/infer", json=BODY)
            assert half.status_code == 404 and "half-copied" in half.json()["error"], half.text
            assert httpx.get(f"{replica.url}/v2/models/half/ready").status_code == 400
        # the copy completes (renamed into place): every replica loads it
        repaired = tmp_path / "repaired"
        write_model(repaired, "half", vector_config(), textwrap.dedent(PLUS.format(step=5)))
        (repository / "half" / "1" / "model.py").unlink()
        (repaired / "half" / "1" / "model.py").rename(repository / "half" / "1" / "model.py")
        deadline = time.monotonic() + 30
        while True:
            answers = [
                httpx.post(f"{replica.url}/v2/models/half/infer", json=BODY) for replica in replicas
            ]
            if all(answer.status_code == 200 for answer in answers):
                break
            assert time.monotonic() < deadline, [answer.text for answer in answers]
            time.sleep(0.2)
        assert {answer.json()["outputs"][0]["data"][0] for answer in answers} == {5.0}
        for replica in replicas:
            assert httpx.get(f"{replica.url}/v2/health/ready").status_code == 200
    finally:
        for replica in replicas:
            assert replica.stop() == 0, replica.log()
