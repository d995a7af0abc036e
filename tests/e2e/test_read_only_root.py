"""The manifests run reposerve with `readOnlyRootFilesystem: true` and emptyDir volumes for
what it writes. Here the server runs that way for real: in a bubblewrap sandbox whose root
is the machine's, read-only, with a fresh writable file system at each of the Deployment's
volume mounts (its cache and /tmp) and the model repository read-only, as KServe mounts
/mnt/models. Python and fp16 ONNX models (the fp16 graph is written to the cache) load and
answer."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests import model_files
from tests.manifests import KUSTOMIZE, render
from tests.server import REPO_ROOT, Server
from tests.toy_models import PLUS_ONE, vector_config, write_model
from tools.bench.servers import children_of

pytestmark = [pytest.mark.e2e, pytest.mark.tool]

UNPACKED = REPO_ROOT / ".tools" / "deploy" / "bubblewrap" / "usr" / "bin" / "bwrap"
BWRAP = str(UNPACKED) if UNPACKED.exists() else shutil.which("bwrap")


def _sandboxes() -> bool:
    if BWRAP is None:
        return False
    probe = [BWRAP, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _deployment_container() -> dict:
    if not KUSTOMIZE.exists():
        pytest.skip("kustomize is not installed: run tools/install_deploy_tools.sh")
    documents = render(REPO_ROOT / "deploy" / "k8s" / "overlays" / "cpu", [str(KUSTOMIZE), "build"])
    (deployment,) = [document for document in documents if document["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _sandbox(container: dict, repository: Path) -> list[str]:
    """The container's file systems: the root read-only, each volume mount a new tmpfs
    (an emptyDir; its parent is made a tmpfs first where the machine lacks the folder),
    the repository and the code read-only, the container's environment."""
    command = [
        BWRAP,
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]
    for mount in container["volumeMounts"]:
        path = Path(mount["mountPath"])
        if not path.exists():
            command += ["--tmpfs", str(path.parent)]
        command += ["--tmpfs", str(path)]
    # what a tmpfs above may hide (a checkout or a repository under /tmp), read-only again:
    # in a container the code and the repository are on their own mounts too
    for needed in {repository, REPO_ROOT, Path(sys.prefix), Path(sys.base_prefix)}:
        command += ["--ro-bind", str(needed), str(needed)]
    for variable in container["env"]:
        command += ["--setenv", variable["name"], variable["value"]]
    return command


@pytest.mark.skipif(
    not _sandboxes(),
    reason="bubblewrap is missing or cannot make a sandbox here: "
    "run tools/install_deploy_tools.sh (it unpacks Debian's bubblewrap)",
)
def test_the_server_runs_on_a_read_only_root(repository, tmp_path):
    container = _deployment_container()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    write_model(repository, "plus", vector_config(), PLUS_ONE)
    write_model(
        repository, "onnx_fp16", 'max_batch_size = 8\n[optimization]\nprecision = "fp16"\n', None
    )
    model_files.export_onnx(repository / "onnx_fp16" / "1" / "model.onnx")
    server = Server(
        repository, log_path=tmp_path / "server.log", wrapper=_sandbox(container, repository)
    )
    try:
        server.wait_ready()
        body = {
            "inputs": [{"name": "INPUT", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]
        }
        reply = httpx.post(f"{server.url}/v2/models/plus/infer", json=body)
        assert reply.json()["outputs"][0]["data"] == [2.0] * 16, reply.text
        metadata = httpx.get(f"{server.url}/v2/models/onnx_fp16").json()
        (tensor,) = metadata["inputs"]
        values = np.linspace(-1, 1, int(np.prod(tensor["shape"][1:])), dtype=np.float32)
        request = {
            "inputs": [
                {
                    "name": tensor["name"],
                    "shape": [1, *tensor["shape"][1:]],
                    "datatype": tensor["datatype"],
                    "data": values.tolist(),
                }
            ]
        }
        reply = httpx.post(f"{server.url}/v2/models/onnx_fp16/infer", json=request)
        assert reply.status_code == 200, reply.text
        answer = np.array(reply.json()["outputs"][0]["data"], dtype=np.float32)
        expected = model_files.reference(values.reshape(1, -1)).ravel()
        np.testing.assert_allclose(answer, expected, atol=model_files.TOLERANCE["fp16"])
        assert "Read-only file system" not in server.log()
        # bubblewrap forwards no signal: SIGTERM goes to the server inside, as the kubelet
        # sends it to the container's process; bubblewrap exits with its status
        (inside,) = children_of(server.process.pid)
        os.kill(inside, signal.SIGTERM)
        assert server.process.wait(30) == 0, server.log()
    finally:
        server.stop()
