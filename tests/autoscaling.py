"""What the autoscaler tests share: a real Prometheus (Debian's, unpacked by
tools/install_deploy_tools.sh) scraping reposerve replicas with the labels the Prometheus
Operator gives a pod's series, a model whose concurrent requests wait in its queue, and
clients that keep it busy."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from tests.server import REPO_ROOT, Server, free_port

# Debian's package unpacked by tools/install_deploy_tools.sh, or one on PATH
UNPACKED = REPO_ROOT / ".tools" / "deploy" / "prometheus" / "usr" / "bin" / "prometheus"
PROMETHEUS = str(UNPACKED) if UNPACKED.exists() else shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus is not installed: "
    "run tools/install_deploy_tools.sh (it unpacks Debian's prometheus package)",
)
NAMESPACE = "serving"
# The scrape job, named as the Prometheus Operator names a ServiceMonitor's: the Service.
JOB = "reposerve"

# One instance, no batching, 30 ms a request: concurrent requests wait in the queue.
QUEUEING_MODEL = "queueing"
QUEUEING = """
    import time

    class Model:
        def execute(self, inputs):
            time.sleep(0.03)
            return {"OUTPUT": inputs["INPUT"] + 1}
"""


class Prometheus:
    """A Prometheus scraping each server every second as the pod named by its key."""

    def __init__(self, targets: dict[str, Server], folder: Path) -> None:
        scrape = {
            "job_name": JOB,
            "scrape_interval": "1s",
            "static_configs": [
                # the labels the Prometheus Operator puts on a pod's series
                {
                    "targets": [f"127.0.0.1:{server.metrics_port}"],
                    "labels": {"namespace": NAMESPACE, "pod": pod},
                }
                for pod, server in targets.items()
            ],
        }
        config = folder / "prometheus.yml"
        config.write_text(yaml.safe_dump({"scrape_configs": [scrape]}))
        self.url = f"http://127.0.0.1:{free_port()}"
        assert PROMETHEUS is not None
        self._log = (folder / "prometheus.log").open("w")
        self._process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params: str) -> list[dict]:
        reply = httpx.get(f"{self.url}{path}", params=params, timeout=10).json()
        assert reply["status"] == "success", reply
        return reply["data"]["result"] if path.endswith("query") else reply["data"]

    def query(self, expression: str) -> dict[str, float]:
        """An instant query's samples by their pod label ("" for an aggregate)."""
        return {
            sample["metric"].get("pod", ""): float(sample["value"][1])
            for sample in self.get("/api/v1/query", query=expression)
        }

    def wait(
        self,
        expression: str,
        predicate: Callable[[dict[str, float]], bool],
        timeout: float = 30.0,
    ) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        found: dict[str, float] | None = None
        while found is None or not predicate(found):
            assert time.monotonic() < deadline, f"{expression}: {found}"
            time.sleep(0.2)
            try:
                found = self.query(expression)
            except httpx.TransportError:  # not listening yet
                continue
        return found

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)
        self._log.close()


class Load:
    """``clients`` threads calling the queueing model back to back, until ``stop``."""

    def __init__(self, server: Server, clients: int) -> None:
        self._server = server
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.answered = 0
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._client) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _client(self) -> None:
        body = {
            "inputs": [{"name": "INPUT", "shape": [16], "datatype": "FP32", "data": [1.0] * 16}]
        }
        with httpx.Client(base_url=self._server.url, timeout=30) as client:
            while not self._stopping.is_set():
                reply = client.post(f"/v2/models/{QUEUEING_MODEL}/infer", json=body)
                with self._lock:
                    if reply.status_code == 200:
                        self.answered += 1
                    else:
                        self.failures.append(reply.text)

    def wait_answered(self, count: int, timeout: float = 180.0) -> None:
        """A hang detector: a loaded CI machine answers slowly, never this slowly."""
        deadline = time.monotonic() + timeout
        while self.answered < count:
            assert time.monotonic() < deadline, f"{self.answered} answered, {count} awaited"
            assert self.failures == []
            time.sleep(0.05)

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        assert self.failures == []
