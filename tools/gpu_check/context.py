"""One run's context: the options, the node, the temporary folder, and the reposerve
servers the phases start (each logging to the output folder, all stopped when a phase
ends)."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tools.bench import servers
from tools.gpu_check.node import Node
from tools.gpu_check.report import Phase

if TYPE_CHECKING:
    from tritonclient.http import InferenceServerClient


class Server:
    """A reposerve process on a free port, with its log in the output folder.

    Not ``tools.bench.servers.Launched``: this one returns before the server is ready, so
    that ``Run`` can stop a server that never gets ready or that the budget interrupts; it
    logs stdout too, waits up to 300 s (the GPU warmups) and keeps its cache in the run's
    temporary folder."""

    def __init__(self, label: str, repository: Path, flags: list[str], log_path: Path) -> None:
        self.label = label
        self.port = servers.free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        environment.setdefault("REPOSERVE_CACHE_DIR", str(repository.parent / "cache"))
        self.process = subprocess.Popen(
            servers.reposerve_command(repository, self.port, "--exit-timeout-secs", "5", *flags),
            cwd=servers.ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=environment,
        )
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds until ``/v2/health/ready`` answered 200."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.label} server exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                if self.http.get("/v2/health/ready", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.label} server not ready after {timeout:g} s")

    def wait_model_ready(self, model: str, timeout: float = 120.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.http.get(f"/v2/models/{model}/ready").status_code == 200:
                return time.monotonic() - started
            time.sleep(0.05)
        raise TimeoutError(f"{model} not ready after {timeout:g} s")

    def infer_flag(self, model: str, flag: int) -> httpx.Response:
        """One item ``[flag]`` (INT32) as JSON, for the small probe and fault models."""
        tensor = {"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [flag]}
        return self.http.post(f"/v2/models/{model}/infer", json={"inputs": [tensor]})

    @contextmanager
    def triton(self) -> Iterator[InferenceServerClient]:
        """A tritonclient.http client, with time for a batch on a CPU."""
        import tritonclient.http as triton

        client = triton.InferenceServerClient(
            self.address, connection_timeout=120.0, network_timeout=120.0
        )
        try:
            yield client
        finally:
            client.close()

    def stats(self, model: str) -> tuple[int, int]:
        """(items, batches) the model has run."""
        document = self.http.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
        return document["inference_count"], document["execution_count"]

    def log_tail(self, size: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-size:]

    def stop(self) -> None:
        self.http.close()
        servers.stop_process(self.process, grace_s=20)
        self._log.close()


def explicit(*models: str) -> list[str]:
    """Server flags: load only ``models`` at start."""
    return ["--model-control-mode", "explicit", *(f"--load-model={model}" for model in models)]


class Run:
    """One run: the node, the options, the temporary folder and the servers to stop."""

    def __init__(self, args: argparse.Namespace, node: Node, workdir: Path) -> None:
        self.args = args
        self.node = node
        self.workdir = workdir
        self.servers: list[Server] = []

    def repository(self, name: str) -> Path:
        path = self.workdir / name / "repository"
        path.mkdir(parents=True)
        return path

    def serve(self, label: str, repository: Path, *flags: str) -> Server:
        server = Server(label, repository, list(flags), self.args.out / f"{label}.log")
        self.servers.append(server)  # before waiting: a server that never gets ready is stopped too
        server.wait_ready()
        return server

    def stop_servers(self) -> dict[str, str]:
        """Stop every server; returns their log tails."""
        tails = {}
        for server in self.servers:
            server.stop()
            tails[server.label] = server.log_tail()
        self.servers.clear()
        return tails

    def gpu_ready(self, phase: Phase, part: str) -> bool:
        """Whether ``part`` can run on a GPU; when not, the phase says why: skipped where
        there is no GPU, failed where there is one this torch cannot use (a setup fault the
        session must see, not a quiet skip)."""
        node = self.node
        if not node.gpus:
            phase.skip_part(part, node.no_gpu_reason)
            return False
        if not node.cuda:
            phase.check(
                part,
                False,
                f"nvidia-smi lists {len(node.gpus)} GPU(s) but torch {node.torch} cannot use "
                "CUDA. Hint: install a CUDA build of torch in this environment",
            )
            return False
        return True

    def gpu_unusable(self, phase: Phase, part: str) -> bool:
        """Whether there are GPUs this torch cannot use; then ``part`` fails, saying why, and
        the phase runs none of its CPU part either."""
        if self.node.gpus and not self.node.cuda:
            self.gpu_ready(phase, part)  # records the failure, and why
            return True
        return False
