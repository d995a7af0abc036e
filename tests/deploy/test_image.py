"""The container image, built and run here: the Dockerfile builds with buildah (on the
registry's base, or a Debian base made with mmdebstrap where the registry cannot be reached),
and the image serves its bundled repository to Triton's clients, as uid 1000, on a read-only
root, and exits cleanly within the Deployment's grace on SIGTERM.

The build is reused when its inputs are unchanged (a label holds their digest), so only the
first run pays for it. Where no engine, no base or no root is had, the tests say which."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from tests.server import REPO_ROOT
from tools.bench.servers import free_port
from tools.image.base import REGISTRY_BASE, ensure_base
from tools.image.build import (
    DEFAULT_TAG,
    INPUTS_LABEL,
    BuildRequest,
    PipSettings,
    build,
    build_arguments,
    request_for,
)
from tools.image.engine import Engine, EngineError, find_engine
from tools.image.run import ReadOnlyContainer

# The first build on 2 cores: about 15 minutes (most of it copying torch and its CUDA
# libraries into layers); a hang detector, not a speed bound.
BUILD_TIMEOUT_S = 3600
# the bundled repository loads ResNet-50 three ways; on a loaded 2-core machine that is slow
READY_TIMEOUT_S = 600


def _grace_s() -> float:
    """The Deployment's terminationGracePeriodSeconds: the kubelet's SIGKILL comes after it."""
    deployment = yaml.safe_load(
        (REPO_ROOT / "deploy" / "k8s" / "base" / "deployment.yaml").read_text()
    )
    return float(deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    if os.geteuid() != 0:
        pytest.skip("buildah's chroot isolation and the read-only root's mounts need root")
    try:
        engine = find_engine("buildah")
    except EngineError as error:
        pytest.skip(str(error))
    try:
        base = ensure_base(engine, REGISTRY_BASE)
    except EngineError as error:
        pytest.skip(f"no base image: {error}")
    log = tmp_path_factory.mktemp("image") / "build.log"
    built = build(request_for(DEFAULT_TAG, base), engine, log=log, timeout=BUILD_TIMEOUT_S)
    how = "reused" if built.reused else "built"
    print(f"{built.tag} {how} in {built.seconds:.0f} s on {base}")
    return built.tag


def _wait_ready(url: str, container: ReadOnlyContainer, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert container.process.poll() is None, f"the container exited:\n{log.read_text()}"
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"not ready after {READY_TIMEOUT_S} s:\n{log.read_text()}")


@pytest.mark.e2e
@pytest.mark.tool
def test_the_image_serves_tritons_clients_as_uid_1000_on_a_read_only_root(image, tmp_path):
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log = tmp_path / "container.log"
    started = time.monotonic()
    container = ReadOnlyContainer(
        image,
        ["--model-repository", "/mnt/models", "--http-host", "127.0.0.1",
         "--http-port", str(http_port), "--grpc-port", str(grpc_port),
         "--metrics-port", str(metrics_port)],
        log,
    )  # fmt: skip
    try:
        _wait_ready(f"http://127.0.0.1:{http_port}", container, log)
        ready_s = time.monotonic() - started
        values = np.arange(16, dtype=np.int32).reshape(1, 16)

        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(values)
        answer = http.infer("add_sub", inputs)
        first_answer_s = time.monotonic() - started
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), values * 2)
        index = {model["name"]: model["state"] for model in http.get_model_repository_index()}
        assert index and set(index.values()) == {"READY"}, index

        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as grpc:
            inputs = [
                grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")
            ]
            for tensor in inputs:
                tensor.set_data_from_numpy(values)
            answer = grpc.infer("add_sub", inputs)
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), values * 0)

        server = container.main_pid()
        status = Path(f"/proc/{server}/status").read_text()
        (uids,) = [line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")]
        assert uids == ["1000"] * 4, status
        mounts = [line.split() for line in Path(f"/proc/{server}/mounts").read_text().splitlines()]
        root_options = [fields[3].split(",") for fields in mounts if fields[1] == "/"]
        assert root_options and "ro" in root_options[-1], mounts
        assert "Read-only file system" not in log.read_text()

        grace = _grace_s()
        stopping = time.monotonic()
        assert container.stop(timeout=grace) == 0, log.read_text()
        print(
            f"ready {ready_s:.1f} s after start, first answer {first_answer_s:.1f} s; "
            f"exit {time.monotonic() - stopping:.1f} s after SIGTERM (grace {grace:.0f} s)"
        )
    finally:
        container.close()


@pytest.mark.tool
def test_a_second_build_from_the_same_inputs_keeps_the_image(image, tmp_path):
    engine = find_engine("buildah")
    labels = engine.labels(image)
    base = ensure_base(engine, REGISTRY_BASE)
    again = build(request_for(DEFAULT_TAG, base), engine, log=tmp_path / "build.log")
    assert again.reused and labels is not None and labels[INPUTS_LABEL] == again.inputs
    assert not (tmp_path / "build.log").exists()  # the engine was not asked to build


@pytest.mark.unit
def test_local_package_sources_are_mounted_read_only_and_the_ca_stays_out_of_the_image(
    tmp_path,
):
    wheels, index = tmp_path / "wheels", tmp_path / "pypi" / "simple"
    wheels.mkdir()
    index.mkdir(parents=True)
    ca = tmp_path / "ca.crt"
    ca.write_text("a CA bundle")
    pip = PipSettings(
        index_url="https://mirror.example/simple",
        extra_index_urls=(f"file://{index}",),
        find_links=(str(wheels),),
        cert=str(ca),
    )
    request = BuildRequest(tag="t", base="b", pip=pip)
    arguments, mounts = build_arguments(request, Engine("buildah", "/usr/bin/buildah"))
    assert arguments == {
        "BASE": "b",
        "EXTRAS": "onnx,torch,gpu",
        "PIP_INDEX_URL": "https://mirror.example/simple",
        "PIP_EXTRA_INDEX_URL": f"file://{index}",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CERT": "/run/reposerve-build-ca.crt",
    }
    root = index.parent  # a simple index links to files beside it
    assert mounts == [
        f"{root}:{root}:ro",
        f"{wheels}:{wheels}:ro",
        f"{ca}:/run/reposerve-build-ca.crt:ro",
    ]
    # docker mounts nothing into a build: only what it can reach over the network is passed
    arguments, mounts = build_arguments(request, Engine("docker", "/usr/bin/docker"))
    assert mounts == []
    assert arguments["PIP_EXTRA_INDEX_URL"] == arguments["PIP_FIND_LINKS"] == ""
    assert "PIP_CERT" not in arguments
