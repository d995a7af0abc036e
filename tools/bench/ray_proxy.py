"""What Ray Serve's proxy costs: the same model behind reposerve's own HTTP front and
behind Ray's HTTP proxy (``reposerve.ray:app``, one replica holding the same server), in
interleaved rounds of one run, reported as Ray's share of reposerve's throughput and each
one's p50. Ray's floor is measured beside them: a Ray deployment that returns the body it
got, through the same proxy (what any model served by Ray pays before its own work).

The workload is the overhead scenario's (+1 on FP32[16], dynamically batched), in V2 JSON
and binary, at concurrency 1 and 8. Ray runs as a one-node local cluster (``ray start
--head``) with its proxy on the head; the reposerve command and the Ray cluster are both
up through every round, so each side measures with the other idle beside it.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from reposerve.tune.load import RunResult, closed_loop
from tools.bench import servers
from tools.bench.ray_cluster import RayCluster
from tools.bench.scenarios import (
    HOST,
    PLUS_ONE,
    PLUS_ONE_CONFIG,
    Report,
    _binary_payloads,
    _json_payloads,
    _model,
    median_run,
)

CONCURRENCIES = (1, 8)
ECHO_PATH = "/echo"  # Ray's echo deployment's route
# The throughput ratios reported: what Ray's proxy costs reposerve, and what reposerve
# costs inside Ray against Ray's own floor.
RATIOS = {
    "json: ray proxy / reposerve throughput": ("ray proxy json", "reposerve json"),
    "binary: ray proxy / reposerve throughput": ("ray proxy binary", "reposerve binary"),
    "json: ray proxy / ray proxy echo throughput": ("ray proxy json", "ray proxy echo"),
}


def _echo_deployment() -> Any:
    """A Ray deployment answering each request with its body (Ray's plain HTTP form)."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    @serve.deployment(name="echo")
    class Echo:
        async def __call__(self, request: Request) -> Response:
            return Response(await request.body(), media_type="application/json")

    return Echo.bind()


def _echo_payloads(json_payloads: list[bytes]) -> list[bytes]:
    """The JSON requests, sent to the echo deployment's route."""
    return [
        payload.replace(b"/v2/models/plus_one/infer", ECHO_PATH.encode(), 1)
        for payload in json_payloads
    ]


def _deploy(cluster: RayCluster, repository: Path) -> int:
    """``reposerve.ray:app`` on ``cluster``, one replica; the proxy's port once it runs."""
    import ray
    from ray import serve

    import reposerve.ray

    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    port = servers.free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": HOST, "port": port})
    application = reposerve.ray.app({"model_repository": str(repository), "num_replicas": 1})
    serve.run(application, name="reposerve", route_prefix="/")
    serve.run(_echo_deployment(), name="echo", route_prefix=ECHO_PATH)
    return port


def _undeploy() -> None:
    import ray
    from ray import serve

    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()


async def ray_proxy(duration: float, rounds: int = 3) -> Report:
    runs: dict[tuple[str, int], list[RunResult]] = {}
    ratios: dict[str, list[float]] = {}
    json_payloads = _json_payloads("plus_one", 16)
    binary_payloads = _binary_payloads("plus_one", 16)
    with tempfile.TemporaryDirectory(prefix="rs-ray-bench") as folder:
        root = Path(folder)
        repository = root / "repository"
        _model(repository, "plus_one", PLUS_ONE_CONFIG, PLUS_ONE)
        server = servers.reposerve(repository)
        cluster = RayCluster(root, cpus=2)
        try:
            proxy_port = await asyncio.to_thread(_deploy, cluster, repository)
            # (label, port, payloads) measured back to back in each round
            workloads = [
                (f"{front} {kind}", port, payloads)
                for kind, payloads in (("json", json_payloads), ("binary", binary_payloads))
                for front, port in (("reposerve", server.port), ("ray proxy", proxy_port))
            ]
            workloads.append(("ray proxy echo", proxy_port, _echo_payloads(json_payloads)))
            for _ in range(rounds):
                for concurrency in CONCURRENCIES:
                    found = {}
                    for label, port, payloads in workloads:
                        found[label] = await closed_loop(
                            label, HOST, port, payloads, concurrency, duration
                        )
                        runs.setdefault((label, concurrency), []).append(found[label])
                    for ratio, (over, under) in RATIOS.items():
                        share = found[over].throughput / found[under].throughput
                        ratios.setdefault(f"c={concurrency} {ratio}", []).append(share)
        finally:
            await asyncio.to_thread(_undeploy)
            cluster.stop()
            server.stop()
    results = [median_run(found) for found in runs.values()]
    facts = {key: statistics.median(found) for key, found in ratios.items()}
    for result in results:
        facts[f"c={result.concurrency} {result.label} p50 (ms)"] = result.p50_ms
    return Report("ray-proxy", results, facts)
