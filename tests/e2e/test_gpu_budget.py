"""The GPU memory budget through a real server, on a node whose GPU and NVML are stand-ins:
REPOSERVE_GPU_PROBE lists one fake GPU, and its process query reports what each instance
claims to hold (the python models write their pid and bytes to CLAIMS as they load; they
never touch CUDA). What is real: placement on the GPU, the measurement by pid, eviction,
refusal, and what /stats, the index and the metrics show."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from reposerve.repository.gpus import PROBE_VARIABLE
from tests.server import running_server
from tests.toy_models import vector_body, vector_config, write_model

pytestmark = pytest.mark.e2e

MIB = 1 << 20
GPU = {
    "index": 0,
    "uuid": "GPU-0f0f0f0f-1111-2222-3333-444444444444",
    "name": "Fake",
    "memory": 1 << 30,
}
FLAGS = ("--model-control-mode", "on-demand", "--gpu-memory-budget", "50%")  # 512 MiB

PROBE = """
import json, os, sys
if sys.argv[1:] != ["processes"]:
    print(json.dumps([GPU]))
    sys.exit()
held = []
for line in open(CLAIMS).read().splitlines() if os.path.exists(CLAIMS) else []:
    pid, nbytes = map(int, line.split())
    if os.path.exists(f"/proc/{pid}"):
        held.append({"gpu": 0, "pid": pid, "memory": nbytes})
print(json.dumps(held))
"""

HOLDS = """
    import os

    class Model:
        def load(self, context):
            assert context.device == "cuda:0", context.device  # placed on the (fake) GPU
            with open(CLAIMS, "a") as claims:
                claims.write(f"{os.getpid()} {NBYTES}\\n")

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 1}
"""


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    claims = tmp_path / "claims"
    probe = tmp_path / "probe.py"
    probe.write_text(f"GPU = {GPU!r}\nCLAIMS = {str(claims)!r}\n{PROBE}")
    monkeypatch.setenv(PROBE_VARIABLE, f"{sys.executable} {probe}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return claims


def _repository(root: Path, claims: Path, **mib: int) -> Path:
    for name, amount in mib.items():
        model = HOLDS.replace("CLAIMS", repr(str(claims))).replace("NBYTES", str(amount * MIB))
        write_model(root, name, vector_config(size=4), model)
    return root


def _infer(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", json=vector_body(1.0), timeout=60)


def _index(url: str) -> dict[str, dict]:
    return {e["name"]: e for e in httpx.post(f"{url}/v2/repository/index", json={}).json()}


def test_a_gpu_over_its_budget_evicts_the_least_recently_used_model_on_it(tmp_path, fake_gpu):
    root = _repository(tmp_path / "repository", fake_gpu, a=300, b=300)
    with running_server(root, tmp_path, *FLAGS) as server:
        assert _infer(server.url, "a").status_code == 200
        stats = httpx.get(f"{server.url}/v2/models/a/stats").json()["model_stats"][0]
        usage = {item["type"]: item for item in stats["memory_usage"]}
        assert usage["GPU"] == {"type": "GPU", "id": 0, "byte_size": 300 * MIB}
        assert usage["CPU"]["byte_size"] > 0  # its instance's PSS
        assert _index(server.url)["a"]["memory_usage"] == stats["memory_usage"]

        assert _infer(server.url, "b").status_code == 200  # 600 MiB > 512: a goes
        index = _index(server.url)
        assert index["b"]["state"] == "READY"
        assert index["a"]["state"] == "UNAVAILABLE"
        assert re.fullmatch(
            r"evicted: least recently used, \d+ MiB, 300 MiB on GPU 0 for 'b'",
            index["a"]["reason"],
        ), index["a"]
        metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
        assert f'reposerve_model_resident_gpu_bytes{{model="b",gpu="0"}} {300 * MIB}' in metrics
        assert 'model="a"' not in metrics.split("reposerve_model_resident_gpu_bytes", 1)[1]
        assert "GPU memory budget: 50% on each GPU (GPU 0: 512 MiB)" in server.log()

        assert _infer(server.url, "a").status_code == 200  # back, and b goes in its turn
        assert _index(server.url)["b"]["reason"].endswith("300 MiB on GPU 0 for 'a'")


def test_a_model_larger_than_the_gpu_budget_is_refused_naming_it(tmp_path, fake_gpu):
    root = _repository(tmp_path / "repository", fake_gpu, huge=600)
    with running_server(root, tmp_path, *FLAGS) as server:
        answer = _infer(server.url, "huge")
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert "it takes about 600 MiB, which does not fit the memory budget of GPU 0" in error
        assert "50% (512 MiB)" in error and "--gpu-memory-budget" in error
        assert _index(server.url)["huge"]["state"] == "UNAVAILABLE"


def test_without_a_gpu_the_budget_is_refused_at_start(tmp_path):
    probe = tmp_path / "no_gpus.py"
    probe.write_text("print('[]')")
    environment = {**os.environ, PROBE_VARIABLE: f"{sys.executable} {probe}"}
    environment.pop("CUDA_VISIBLE_DEVICES", None)
    (tmp_path / "repository").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "reposerve", "--model-repository", str(tmp_path / "repository")]
        + ["--gpu-memory-budget", "80%"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--gpu-memory-budget 80%: this server sees no GPU" in done.stderr
    assert "drop the flag, or make a GPU visible" in done.stderr
