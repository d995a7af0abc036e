"""A real local Ray cluster, for the Ray Serve tests and benchmark: a head and more raylets
on this machine, each ``ray start --block`` on free ports, in a folder of the caller's, so
that one node can be killed alone: every process it started, down to the actors' own
(Ray puts each worker in a session of its own, so a process group is not enough)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.bench.servers import children_of, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
STARTED = "Ray runtime started"


def ray_environment() -> dict[str, str]:
    """This checkout importable by every Ray worker; no usage reports."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if part
    )
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


class RayNode:
    """One ``ray start --block``: its raylet (and, on the head, the cluster's services)."""

    def __init__(self, arguments: list[str], resource: str, log_path: Path) -> None:
        self.resource = resource  # a custom resource only this node has, to find it by
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                RAY, "start", "--block", "--disable-usage-stats",
                "--node-ip-address", "127.0.0.1",
                "--resources", json.dumps({resource: 1}),
                "--object-store-memory", str(200 * 2**20),
                "--dashboard-agent-listen-port", str(free_port()),
                "--runtime-env-agent-port", str(free_port()),
                "--metrics-export-port", str(free_port()),
                *arguments,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=ray_environment(),
            start_new_session=True,
        )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_started(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"ray start exited with {self.process.returncode}:\n{self.log()}"
                )
            if STARTED in self.log():
                return
            time.sleep(0.2)
        raise TimeoutError(f"ray start not started after {timeout} s:\n{self.log()}")

    def kill(self) -> float:
        """The node dies at once, as a machine that loses power: SIGKILL to every process
        it started (raylet, workers and what they started), all found before any dies.
        Returns the moment (``time.monotonic``) the first signal went."""
        doomed = _descendants(self.process.pid)
        killed = time.monotonic()
        os.killpg(self.process.pid, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        self._log.close()
        return killed

    def stop(self, timeout: float = 90.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


def _descendants(pid: int) -> list[int]:
    found, pending = [], [pid]
    while pending:
        children = children_of(pending.pop())
        found += children
        pending += children
    return found


class RayCluster:
    """A head node with ``cpus`` CPUs and the resource ``head_node``; ``add_node`` joins
    raylets. ``dashboard`` is the address of Ray's state API (which replica runs where)."""

    def __init__(self, folder: Path, cpus: int = 1) -> None:
        self.folder = folder
        self.cpus = cpus
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        dashboard_port = free_port()
        self.dashboard = f"http://127.0.0.1:{dashboard_port}"
        self.nodes: list[RayNode] = []
        self.head = self._start(
            "head_node",
            [
                "--head", "--port", str(self.port),
                "--temp-dir", str(folder / "ray"),
                "--include-dashboard", "true",
                "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
                "--ray-client-server-port", str(free_port()),
            ],
        )  # fmt: skip

    def add_node(self, resource: str) -> RayNode:
        return self._start(resource, ["--address", self.address])

    def _start(self, resource: str, arguments: list[str]) -> RayNode:
        log_path = self.folder / f"ray-{resource}-{len(self.nodes)}.log"
        node = RayNode(["--num-cpus", str(self.cpus), *arguments], resource, log_path)
        self.nodes.append(node)
        node.wait_started()
        return node

    def stop(self) -> None:
        """Every node, the head last (the others report to it)."""
        for node in reversed(self.nodes):
            node.stop()
