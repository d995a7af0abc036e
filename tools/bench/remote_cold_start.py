"""Cold start from a bucket against the same repository in a local folder.

    python -m tools.bench.remote_cold_start [--runs 3] [--weights-mib 100]

moto's S3 server (a local process: no network latency, so this measures reposerve's side of
a pull) holds a repository of one python model whose version folder also carries a weights
file of ``--weights-mib``. For each source the server is started ``--runs`` times and timed
to ready (``/v2/health/ready``) and to its first answer:

- local: ``--model-repository FOLDER``
- s3 cold: ``--model-repository s3://127.0.0.1:PORT/bucket/repo`` with an empty cache
- s3 warm: the same, the copy of the previous start in the cache (nothing downloaded)

Printed: the median of each, in seconds, as a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import boto3
import httpx

from tools.bench import servers

CONFIG = """
    max_batch_size = 8
    [[input]]
    name = "INPUT"
    datatype = "FP32"
    shape = [1]
    [[output]]
    name = "OUTPUT"
    datatype = "FP32"
    shape = [1]
"""
CODE = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 1}
"""
BODY = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}


def write_repository(root: Path, weights_mib: int) -> None:
    version = root / "add" / "1"
    version.mkdir(parents=True)
    (root / "add" / "config.toml").write_text(textwrap.dedent(CONFIG))
    (version / "model.py").write_text(textwrap.dedent(CODE))
    (version / "weights.bin").write_bytes(os.urandom(weights_mib << 20))


def upload(root: Path, endpoint: str) -> None:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **_keys())
    client.create_bucket(Bucket="bench")
    for path in sorted(root.rglob("*")):
        if path.is_file():
            key = f"repo/{path.relative_to(root).as_posix()}"
            client.put_object(Bucket="bench", Key=key, Body=path.read_bytes())


def _keys() -> dict[str, str]:
    return {"aws_access_key_id": KEYS["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": "bench"}


def start_once(repository: str, cache: Path) -> tuple[float, float]:
    """Seconds from the start to ready, and to the first answer."""
    port = servers.free_port()
    command = [
        sys.executable, "-m", "reposerve",
        "--model-repository", repository,
        "--repository-cache-dir", str(cache),
        "--http-host", "127.0.0.1", "--http-port", str(port),
        "--allow-grpc", "false", "--allow-metrics", "false",
    ]  # fmt: skip
    started = time.perf_counter()
    server = servers.Launched("reposerve", command, port, "/v2/health/ready")
    try:
        reply = httpx.post(f"http://127.0.0.1:{port}/v2/models/add/infer", json=BODY, timeout=60)
        reply.raise_for_status()
        return server.ready_s, time.perf_counter() - started
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--weights-mib", type=int, default=100)
    args = parser.parse_args()
    os.environ.update({**KEYS, "AWS_DEFAULT_REGION": "us-east-1"})
    work = Path(tempfile.mkdtemp(prefix="remote-cold-start-"))
    moto_port = servers.free_port()
    moto = servers.Launched(
        "moto",
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)],
        moto_port,
        "/moto-api/",
    )
    try:
        write_repository(work / "repository", args.weights_mib)
        upload(work / "repository", f"http://127.0.0.1:{moto_port}")
        bucket = f"s3://127.0.0.1:{moto_port}/bench/repo"
        cache = work / "cache"
        timings: dict[str, list[tuple[float, float]]] = {"local": [], "s3 cold": [], "s3 warm": []}
        for _ in range(args.runs):
            timings["local"].append(start_once(str(work / "repository"), cache))
            shutil.rmtree(cache, ignore_errors=True)
            timings["s3 cold"].append(start_once(bucket, cache))
            timings["s3 warm"].append(start_once(bucket, cache))
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"one python model with {args.weights_mib} MiB of weights; median of {args.runs}")
    print("| source | start to ready (s) | start to first answer (s) |")
    print("|---|---|---|")
    for source, runs in timings.items():
        ready = statistics.median(run[0] for run in runs)
        answered = statistics.median(run[1] for run in runs)
        print(f"| {source} | {ready:.2f} | {answered:.2f} |")


if __name__ == "__main__":
    main()
