"""Placement through a real server: Triton's default groups on (fake) GPUs, each instance
given its device by UUID, and instance processes pinned to the cores their group names.

The GPUs come from REPOSERVE_GPU_PROBE, a command standing in for the NVML probe; python
models never touch CUDA, so the instances load on a machine without one."""

from __future__ import annotations

import json
import os
import shlex

import httpx
import msgspec
import pytest

from reposerve.repository.gpus import PROBE_VARIABLE
from reposerve.repository.nvml import Gpu
from tests.server import start_server
from tests.toy_models import vector_config, write_model

pytestmark = pytest.mark.e2e

NODE = [
    Gpu(0, "GPU-11111111-2222-3333-4444-555555555555", "Fake H200", 141 << 30),
    Gpu(1, "GPU-66666666-7777-8888-9999-000000000000", "Fake H200", 141 << 30),
]
CORES = sorted(os.sched_getaffinity(0))

# Appends what its process was given, as one JSON line, to LOADED beside model.py.
REPORTS = """
    import json
    import os

    class Model:
        def load(self, context):
            report = {
                "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "device": context.device,
                "threads": os.environ["OMP_NUM_THREADS"],
                "cores": sorted(os.sched_getaffinity(0)),
            }
            with open(context.version_path / "LOADED", "a") as log:
                log.write(json.dumps(report) + "\\n")

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"]}
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    listing = root.parent / "gpus.json"
    listing.write_bytes(msgspec.json.encode(NODE))
    write_model(root, "by_default", vector_config(), REPORTS)
    pinned = f"[[instance_group]]\ncount = 2\ncpus = [{CORES[-1]}]"
    write_model(root, "pinned", vector_config(extra=pinned), REPORTS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PROBE_VARIABLE, shlex.join(["cat", str(listing)]))
        patch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server, root
    assert server.stop() == 0, server.log()


def _loaded(root, model: str) -> list[dict]:
    lines = (root / model / "1" / "LOADED").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_no_instance_group_means_one_instance_per_gpu_by_uuid(served):
    server, root = served
    loaded = _loaded(root, "by_default")
    assert sorted(report["cuda_visible_devices"] for report in loaded) == [g.uuid for g in NODE]
    assert len({report["pid"] for report in loaded}) == 2
    assert {report["device"] for report in loaded} == {"cuda:0"}
    groups = httpx.get(f"{server.url}/v2/models/by_default/config").json()["instance_group"]
    assert [(g["kind"], g["count"], g["gpus"]) for g in groups] == [("KIND_GPU", 1, [0, 1])]
    body = {"inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16}]}
    assert httpx.post(f"{server.url}/v2/models/by_default/infer", json=body).status_code == 200
    log = server.log()
    for index, gpu in enumerate(NODE):
        assert f"GPU {index}: {gpu.uuid} (Fake H200, 141.0 GiB)" in log


@pytest.mark.skipif(len(CORES) < 2, reason="pinning to one core of one changes nothing")
def test_a_groups_cpus_pin_every_thread_of_its_instances(served):
    server, root = served
    loaded = _loaded(root, "pinned")
    assert len(loaded) == 2
    for report in loaded:
        assert report["cores"] == [CORES[-1]]
        assert report["threads"] == "1"  # two instances on one core: one thread each
        assert report["cuda_visible_devices"] == ""  # a cpu group, on a node with GPUs
        for thread in os.listdir(f"/proc/{report['pid']}/task"):
            assert os.sched_getaffinity(int(thread)) == {CORES[-1]}
    groups = httpx.get(f"{server.url}/v2/models/pinned/config").json()["instance_group"]
    assert [(g["kind"], g["count"], g["gpus"]) for g in groups] == [("KIND_CPU", 2, [])]
