"""``initial_state.data_file`` stays inside its model folder, as label files do, whatever
names it: a load request's config override (with file overrides off), config.toml or
config.pbtxt. A file outside is neither read nor sized."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.sequence_models import ACCUMULATE_BASE, write_accumulate
from tests.server import running_server

pytestmark = pytest.mark.e2e

KEY = "sequence_batching.state[0].initial_state.data_file"
SECRET = 4242.0  # what the file outside holds: it must never reach an answer


def _sum(client: httpclient.InferenceServerClient, model: str) -> float:
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
    result = client.infer(model, [tensor], sequence_id=1, sequence_start=True, sequence_end=True)
    return float(result.as_numpy("SUM")[0][0])


@pytest.fixture
def secret(tmp_path):
    """A file outside the repository, the size of the state, and one of another size."""
    (tmp_path / "outside").mkdir()
    fitting = tmp_path / "outside" / "secret"
    fitting.write_bytes(np.float32(SECRET).tobytes())
    (tmp_path / "outside" / "larger").write_bytes(b"x" * 12345)
    return fitting


def test_a_load_override_cannot_point_the_state_outside(repository, tmp_path, secret):
    write_accumulate(repository, "accumulate")
    escapes = [
        str(secret),  # absolute
        str(secret.parent / "larger"),  # its size must not show either
        "../../outside/secret",
        "../config.toml",  # even within the repository's own files, out of initial_state
    ]
    flags = ("--allow-model-file-override", "false")
    with (
        running_server(repository, tmp_path, *flags) as server,
        httpclient.InferenceServerClient(server.address) as client,
    ):
        config = client.get_model_config("accumulate")
        for data_file in escapes:
            config["sequence_batching"]["state"][0]["initial_state"][0]["data_file"] = data_file
            with pytest.raises(InferenceServerException) as caught:
                client.load_model("accumulate", config=json.dumps(config))
            message = caught.value.message()
            assert (
                f'{KEY}: "{data_file}" must name a file in the model\'s initial_state folder '
                "(a relative path, no '..')"
            ) in message
            assert "12345" not in message and "bytes" not in message
        # The folder's own config loads again, its state read from its own file.
        client.load_model("accumulate")
        assert _sum(client, "accumulate") == ACCUMULATE_BASE


@pytest.mark.parametrize("form", ["toml", "pbtxt"])
def test_a_symlink_out_of_the_model_folder_is_refused(repository, tmp_path, secret, form):
    write_accumulate(repository, "accumulate")
    folder = repository / "accumulate"
    (folder / "initial_state" / "base").unlink()
    (folder / "initial_state" / "base").symlink_to(secret)
    if form == "pbtxt":
        (folder / "config.toml").unlink()
        (folder / "config.pbtxt").write_text(_PBTXT)
    flags = ("--exit-on-error", "false", "--strict-readiness", "false")
    with (
        running_server(repository, tmp_path, *flags) as server,
        httpclient.InferenceServerClient(server.address) as client,
    ):
        assert not client.is_model_ready("accumulate")
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        reason = index["accumulate"]["reason"]
        assert f'{KEY}: "initial_state/base" must be a file inside the model folder' in reason
        assert str(secret) not in reason
        assert "4242" not in server.log()


_PBTXT = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
sequence_batching {
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START
                                              int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ]
            initial_state [ { data_type: TYPE_FP32 dims: [ 1 ] data_file: "base" } ] } ]
}
"""
