"""A Triton python model that says itself whether it is ready (``is_ready()``, Triton's
user-defined readiness function), over a real server and Triton's clients: its answer is
the model's readiness over HTTP and gRPC; a check that raises or returns what is not a
bool means not ready; a coroutine check is awaited; the check runs beside execute, never
behind it; a check in flight is asked once for everyone; one that takes longer than
Triton's 5 s counts as not ready, and the next caller waits for its answer."""

from __future__ import annotations

import os
import signal
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.probes import wait_for
from tests.server import running_server, start_server

pytestmark = pytest.mark.e2e

# What is_ready() does is read from a file beside the model, so a test can change it.
MODEL = """
    import asyncio
    import json
    import time
    from pathlib import Path

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.folder = Path(args["model_repository"])
            self.checks = 0

        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                if float(x[0, 0]) < 0:  # hold this execute until the test lets it go
                    _wait_for(self.folder / "go")
                checks = np.array([[self.checks]], dtype=np.int32)
                outputs = [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("CHECKS", checks)]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses

        {prefix}def is_ready(self):
            self.checks += 1
            mode = (self.folder / "mode").read_text().strip()
            if mode == "slow":
                _wait_for(self.folder / "go")
            if mode == "coroutine":
                await asyncio.sleep(0.01)
                return True
            if mode == "raise":
                raise RuntimeError("the cache is cold")
            if mode == "text":
                return "ready"
            return mode in ("true", "slow")


    def _wait_for(path):
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
"""

PBTXT = """
    backend: "python"
    max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [
      { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] },
      { name: "CHECKS" data_type: TYPE_INT32 dims: [ 1 ] }
    ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    for name, prefix in (("checked", ""), ("checked_async", "async ")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(textwrap.dedent(PBTXT))
        code = MODEL.replace("{prefix}", prefix)
        if not prefix:  # a sync check has no await in it
            code = code.replace("await asyncio.sleep(0.01)", "pass")
        (root / name / "1" / "model.py").write_text(textwrap.dedent(code))
        (root / name / "mode").write_text("true")
    return root


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory.mktemp("log"), "--strict-readiness", "false")
    yield server
    assert server.stop() == 0, server.log()


def _set(repository: Path, model: str, mode: str) -> None:
    (repository / model / "mode").write_text(mode)
    (repository / model / "go").unlink(missing_ok=True)


def _ready(server, model: str) -> tuple[bool, bool]:
    http = httpclient.InferenceServerClient(server.address)
    grpc = grpcclient.InferenceServerClient(server.grpc_address)
    return http.is_model_ready(model), grpc.is_model_ready(model)


def _checks(server, model: str, value: float = 1.0) -> int:
    """Infer once; the number of readiness checks the model has run so far."""
    client = httpclient.InferenceServerClient(server.address, network_timeout=60)
    x = np.full((1, 2), value, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 2], "FP32")]
    inputs[0].set_data_from_numpy(x)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    return int(result.as_numpy("CHECKS")[0, 0])


@pytest.mark.parametrize(
    ("model", "mode", "ready"),
    [
        ("checked", "true", True),
        ("checked", "false", False),
        ("checked", "raise", False),
        ("checked", "text", False),
        ("checked_async", "coroutine", True),
        ("checked_async", "false", False),
    ],
)
def test_the_models_own_check_is_its_readiness(server, repository, model, mode, ready):
    _set(repository, model, mode)
    assert _ready(server, model) == (ready, ready)
    _checks(server, model)  # inference is unaffected either way


def test_why_a_model_is_not_ready_is_logged_in_tritons_words(server, repository):
    _set(repository, "checked", "false")
    assert _ready(server, "checked") == (False, False)
    _set(repository, "checked", "raise")
    assert _ready(server, "checked") == (False, False)
    _set(repository, "checked", "text")
    assert _ready(server, "checked") == (False, False)
    log = server.log()
    prefix = "Model 'checked' version 1 is not ready: "
    assert prefix + "Model 'checked_0_0' is not ready (user-defined check failed)." in log
    assert prefix + "RuntimeError: the cache is cold" in log
    assert prefix + "TypeError: is_ready() must return a boolean value" in log


def test_the_check_runs_beside_a_running_execute(server, repository):
    _set(repository, "checked", "true")
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(_checks, server, "checked", -1.0)  # execute waits for "go"
        assert _ready(server, "checked") == (True, True)  # answered meanwhile
        assert not held.done()
        (repository / "checked" / "go").write_text("")
        held.result(timeout=60)


def test_a_check_in_flight_is_asked_once_and_past_the_timeout_means_not_ready(server, repository):
    _set(repository, "checked", "slow")
    before = _checks(server, "checked")

    def ask(_: int) -> bool:
        return httpclient.InferenceServerClient(server.address).is_model_ready("checked")

    with ThreadPoolExecutor(8) as pool:  # each waits Triton's 5 s for the one check
        assert list(pool.map(ask, range(8))) == [False] * 8
    assert _checks(server, "checked") == before + 1  # the model runs meanwhile
    (repository / "checked" / "go").write_text("")
    grpc = grpcclient.InferenceServerClient(server.grpc_address)
    # The answer of the check in flight, or (once that has come) of a check of its own.
    assert grpc.is_model_ready("checked") is True
    assert "Timed out waiting for user-defined is_ready() response" in server.log()


IDENTITY = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            return responses
"""

IDENTITY_PBTXT = """
    backend: "python"
    max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def _identity(server) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.address, network_timeout=60)
    inputs = [httpclient.InferInput("INPUT0", [1, 2], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    return client.infer("identity", inputs).as_numpy("OUTPUT0")


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGKILL])
def test_on_request_restart_keeps_a_dead_instance_down_until_a_request_comes(tmp_path, sig):
    """--instance-restart on-request, Triton's python backend: a killed stub leaves the
    model not ready (so said in the log, in Triton's words) until a request comes; that
    request fails naming the stub, the replacement starts, and the next one is served."""
    (tmp_path / "repository" / "identity" / "1").mkdir(parents=True)
    folder = tmp_path / "repository" / "identity"
    (folder / "config.pbtxt").write_text(textwrap.dedent(IDENTITY_PBTXT))
    (folder / "1" / "model.py").write_text(textwrap.dedent(IDENTITY))
    with running_server(
        tmp_path / "repository", tmp_path, "--instance-restart", "on-request"
    ) as server:
        http = httpclient.InferenceServerClient(server.address)
        grpc = grpcclient.InferenceServerClient(server.grpc_address)
        (stub,) = server.instance_pids()
        os.kill(stub, sig)
        wait_for(lambda: not http.is_model_ready("identity"), what="the model to go unready")
        assert not grpc.is_model_ready("identity")
        assert server.instance_pids() == []  # nothing restarts it meanwhile
        with pytest.raises(InferenceServerException) as failed:
            _identity(server)
        assert "Stub process 'identity_0_0' is not healthy." in str(failed.value)
        np.testing.assert_array_equal(_identity(server), np.ones((1, 2), np.float32))
        assert http.is_model_ready("identity") and grpc.is_model_ready("identity")
    log = server.log()
    said = "Model 'identity' version 1 is not ready: Stub process 'identity_0_0' is not healthy."
    assert log.count(said) >= 2, log


def test_by_default_a_dead_instance_is_replaced_without_waiting_for_a_request(tmp_path):
    (tmp_path / "repository" / "identity" / "1").mkdir(parents=True)
    folder = tmp_path / "repository" / "identity"
    (folder / "config.pbtxt").write_text(textwrap.dedent(IDENTITY_PBTXT))
    (folder / "1" / "model.py").write_text(textwrap.dedent(IDENTITY))
    with running_server(tmp_path / "repository", tmp_path) as server:
        (stub,) = server.instance_pids()
        os.kill(stub, signal.SIGKILL)
        wait_for(lambda: server.instance_pids() not in ([], [stub]), what="a replacement")
        http = httpclient.InferenceServerClient(server.address)
        wait_for(lambda: http.is_model_ready("identity"), what="the replacement to get ready")
        np.testing.assert_array_equal(_identity(server), np.ones((1, 2), np.float32))
