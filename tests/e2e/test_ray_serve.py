"""reposerve on Ray Serve (``reposerve.ray:app``) on a real local Ray cluster of two nodes
on this machine, a head and a second raylet, deployed with ``serve run``: Triton's HTTP
client through Ray's proxy, a DeploymentHandle call, replicas on both nodes, and the second
node killed under load: only the requests in flight on it fail, and the app recovers."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'reposerve[ray]')")

import ray  # noqa: E402 - after the skip: without Ray there is nothing to import
import tritonclient.http as httpclient  # noqa: E402
from ray import serve  # noqa: E402
from ray.util.state import list_actors  # noqa: E402

from reposerve.errors import RepositoryError  # noqa: E402
from tests.toy_models import SLOW, vector_body, vector_config, write_model  # noqa: E402
from tools.bench.ray_cluster import RayCluster, ray_environment  # noqa: E402
from tools.bench.servers import free_port  # noqa: E402

pytestmark = pytest.mark.e2e

APP = "reposerve"
SERVE = str(Path(sys.executable).parent / "serve")
BATCHING = "[dynamic_batching]\nmax_queue_delay_microseconds = 5000"
# Leaves a file as its instance unloads: the server was stopped, not killed with its replica.
FAREWELL = """
    import os

    class Model:
        def load(self, context):
            self.folder = context.version_path

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"]}

        def unload(self):
            (self.folder / f"unloaded-{os.getpid()}").touch()
"""


class Deployed:
    """The cluster, the app on it, and the address of Ray's HTTP proxy."""

    def __init__(self, cluster: RayCluster, proxy: str, repository: Path) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.repository = repository

    @property
    def url(self) -> str:
        return f"http://{self.proxy}"


def _wait(condition, what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not after {timeout} s")


def _running_replicas() -> int:
    status = serve.status().applications.get(APP)
    if status is None or APP not in status.deployments:
        return 0
    return status.deployments[APP].replica_states.get("RUNNING", 0)


def _replica_nodes(cluster: RayCluster) -> list[str]:
    """The custom resource of the node each live replica runs on."""
    by_id = {
        node["NodeID"]: resource
        for node in ray.nodes()
        if node["Alive"]
        for resource in node["Resources"]
        if resource.endswith("_node")
    }
    actors = list_actors(
        address=cluster.dashboard,
        filters=[("state", "=", "ALIVE"), ("class_name", "=", f"ServeReplica:{APP}:{APP}")],
    )
    return sorted(by_id.get(actor.node_id, actor.node_id) for actor in actors)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray")
    repository = folder / "repository"
    write_model(repository, "slow", vector_config(size=4, extra=BATCHING), SLOW)
    write_model(repository, "farewell", vector_config(size=4), FAREWELL)
    cluster = RayCluster(folder)
    try:
        cluster.add_node("second_node")
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        port = free_port()
        # The proxy on the head alone: both raylets share this machine's ports.
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        subprocess.run(
            [
                SERVE, "run", "--non-blocking", "--address", cluster.address,
                "--name", APP, "--route-prefix", "/",
                "reposerve.ray:app", f"model_repository={repository}",
                "num_replicas=2", "max_replicas_per_node=1", "num_cpus=0.5",
            ],
            env=ray_environment(),
            check=True,
            timeout=300,
        )  # fmt: skip
        _wait(lambda: _running_replicas() == 2, "two replicas running")
        yield Deployed(cluster, f"127.0.0.1:{port}", repository)
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        cluster.stop()


def test_tritons_http_client_works_through_rays_proxy(deployed):
    client = httpclient.InferenceServerClient(deployed.proxy)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("slow")
        metadata = client.get_model_metadata("slow")
        assert metadata["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 4]}]
        rows = np.arange(8, dtype=np.float32).reshape(2, 4)
        for binary in (False, True):  # V2 JSON, and the binary tensor data extension
            tensor = httpclient.InferInput("INPUT", [2, 4], "FP32")
            tensor.set_data_from_numpy(rows, binary_data=binary)
            wanted = httpclient.InferRequestedOutput("OUTPUT", binary_data=binary)
            result = client.infer("slow", [tensor], outputs=[wanted], request_id="r-1")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT"), rows * 2)
            assert result.get_response()["id"] == "r-1"
    finally:
        client.close()
    unknown = httpx.post(f"{deployed.url}/v2/models/nope/infer", json=vector_body(1.0))
    assert unknown.status_code == 404
    assert "nope" in unknown.json()["error"]


def test_a_deployment_handle_call_takes_and_gives_arrays(deployed):
    handle = serve.get_app_handle(APP)
    rows = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = handle.infer.remote("slow", {"INPUT": rows}, request_id="h-1").result()
    assert (result.model_name, result.model_version, result.id) == ("slow", "1", "h-1")
    np.testing.assert_array_equal(result.outputs["OUTPUT"], rows * 2)
    with pytest.raises(RepositoryError, match="nope"):
        handle.infer.remote("nope", {"INPUT": rows}).result()


def test_the_replicas_run_on_both_nodes(deployed):
    assert _replica_nodes(deployed.cluster) == ["head_node", "second_node"]


class Load:
    """Clients sending requests through the proxy until told to stop; each request's
    send and end times and outcome are kept."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.records: list[tuple[float, float, bool]] = []  # sent, ended, answered
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send) for _ in range(clients)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def answered_since(self, moment: float) -> int:
        with self._lock:
            return sum(1 for sent, _, answered in self.records if answered and sent > moment)

    def _send(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    answer = client.post(f"{self.url}/v2/models/slow/infer", json=vector_body(1.0))
                    answered = answer.status_code == 200
                    if answered:
                        assert answer.json()["outputs"][0]["data"] == [2.0, 2.0, 4.0, 6.0]
                except httpx.TransportError:
                    answered = False
                with self._lock:
                    self.records.append((sent, time.monotonic(), answered))


def test_a_node_killed_under_load_costs_only_its_in_flight_requests(deployed):
    """Near the end of this module: it kills the second node (then joins a new one)."""
    cluster = deployed.cluster
    second = next(node for node in cluster.nodes if node.resource == "second_node")
    with Load(deployed.url, clients=8) as load:
        _wait(lambda: load.answered_since(0) >= 40, "answers before the kill")
        killed = second.kill()  # the moment the signals went
        _wait(lambda: load.answered_since(killed) >= 40, "answers after the kill")
    failed = [(sent, ended) for sent, ended, answered in load.records if not answered]
    in_flight = [sent for sent, ended, _ in load.records if sent < killed < ended]
    assert len(load.records) > 80
    # Every failure was a request under way when the node died; no later one failed.
    assert all(sent < killed < ended for sent, ended in failed), (killed, failed)
    assert len(failed) <= len(in_flight)
    # The app recovers: a node joins, Ray places the lost replica there, both answer.
    cluster.add_node("second_node")
    _wait(lambda: _running_replicas() == 2, "two replicas running again")
    assert _replica_nodes(cluster) == ["head_node", "second_node"]
    client = httpclient.InferenceServerClient(deployed.proxy)
    try:
        assert client.is_server_ready()
    finally:
        client.close()


def test_deleting_the_app_stops_each_replicas_server(deployed):
    """Last in this module: the app goes, and each replica's server stops in order (its
    models unload) before Ray ends the replica."""
    unloaded = deployed.repository / "farewell" / "1"
    assert _running_replicas() == 2 and not list(unloaded.glob("unloaded-*"))
    serve.delete(APP)
    assert APP not in serve.status().applications
    assert len(list(unloaded.glob("unloaded-*"))) == 2
