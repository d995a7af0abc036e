"""Triton's classification extension, and the request parameters reposerve refuses by name."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from tests.server import SERVE_BROKEN, running_server, start_server
from tests.toy_models import write_model

pytestmark = pytest.mark.e2e

CLASSES = 6
LABELS = ["cat", "dog", "emu", "fox", "gnu", "hen"]

# The scores are the input itself, so the expected top-k is computed from what was sent.
ECHO = """
    class Model:
        def execute(self, inputs):
            return {"SCORES": inputs["INPUT"], "COUNTS": (inputs["INPUT"] * 10).astype("int32")}
"""


def _config(max_batch: int, label_line: str = 'label_filename = "labels.txt"') -> str:
    return f"""
        max_batch_size = {max_batch}
        [[input]]
        name = "INPUT"
        datatype = "FP32"
        shape = [{CLASSES}]
        [[output]]
        name = "SCORES"
        datatype = "FP32"
        shape = [{CLASSES}]
        {label_line}
        [[output]]
        name = "COUNTS"
        datatype = "INT32"
        shape = [{CLASSES}]
    """


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    batched = write_model(root, "scores", _config(8), ECHO)
    (batched / "labels.txt").write_text("\n".join(LABELS) + "\n")
    single = write_model(root, "scores_nobatch", _config(0), ECHO)
    (single / "labels.txt").write_text("\n".join(LABELS))
    short = write_model(root, "short_labels", _config(8), ECHO)
    (short / "labels.txt").write_text("cat\ndog\n")
    write_model(root, "no_labels_file", _config(8), ECHO)
    started = start_server(root, tmp_path_factory.mktemp("log"), *SERVE_BROKEN)
    yield started
    assert started.stop() == 0, started.log()


@pytest.fixture(scope="module")
def client(server):
    with triton.InferenceServerClient(server.address) as connected:
        yield connected


def _expected(values: np.ndarray, k: int, labels: list[str] | None, floats: bool) -> list:
    """What Triton answers, computed directly: per item, the k highest values first."""
    rows = []
    for row in values.reshape(values.shape[0] if values.ndim > 1 else 1, -1):
        order = sorted(range(row.size), key=lambda i: (-row[i], i))[:k]
        rows.append(
            [
                (f"{float(row[i]):f}" if floats else str(int(row[i])))
                + f":{i}"
                + (f":{labels[i]}" if labels else "")
                for i in order
            ]
        )
    return rows


def _strings(array: np.ndarray) -> list[list[str]]:
    """tritonclient gives bytes for binary BYTES outputs and str for JSON ones."""
    return [[item.decode() if isinstance(item, bytes) else item for item in row] for row in array]


@pytest.mark.parametrize("binary", [True, False])
def test_top_k_with_labels_equals_a_direct_top_k(client, binary):
    values = np.random.default_rng(7).random((3, CLASSES), dtype=np.float32)
    data = triton.InferInput("INPUT", list(values.shape), "FP32")
    data.set_data_from_numpy(values, binary_data=binary)
    result = client.infer(
        "scores",
        [data],
        outputs=[
            triton.InferRequestedOutput("SCORES", binary_data=binary, class_count=3),
            triton.InferRequestedOutput("COUNTS", binary_data=binary, class_count=2),
        ],
    )
    scores = result.get_output("SCORES")
    assert scores["datatype"] == "BYTES" and scores["shape"] == [3, 3]
    assert _strings(result.as_numpy("SCORES")) == _expected(values, 3, LABELS, floats=True)
    # An output without label_filename answers value:index; integers print as integers.
    counts = (values * 10).astype(np.int32)
    assert _strings(result.as_numpy("COUNTS")) == _expected(counts, 2, None, floats=False)


def test_top_k_of_a_model_without_batch_dimension_and_k_past_the_classes(server):
    values = np.array([0.5, 0.25, 0.75, 0.0, 1.0, 0.25], dtype=np.float32)
    body = {
        "inputs": [{"name": "INPUT", "shape": [CLASSES], "datatype": "FP32",
                    "data": values.tolist()}],
        "outputs": [{"name": "SCORES", "parameters": {"classification": 10}}],
    }  # fmt: skip
    response = httpx.post(f"{server.url}/v2/models/scores_nobatch/infer", json=body)
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    assert output["datatype"] == "BYTES" and output["shape"] == [CLASSES]
    # Ties keep the lower index first: 0.25 at 1 before 0.25 at 5.
    assert output["data"] == [
        "1.000000:4:gnu", "0.750000:2:emu", "0.500000:0:cat",
        "0.250000:1:dog", "0.250000:5:hen", "0.000000:3:fox",
    ]  # fmt: skip


def test_outputs_without_classification_are_unchanged(client):
    values = np.arange(CLASSES, dtype=np.float32)[None]
    data = triton.InferInput("INPUT", [1, CLASSES], "FP32")
    data.set_data_from_numpy(values)
    result = client.infer("scores", [data], outputs=[triton.InferRequestedOutput("SCORES")])
    np.testing.assert_array_equal(result.as_numpy("SCORES"), values)


def test_label_files_are_checked_when_the_model_loads(client):
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["short_labels"]["state"] == "UNAVAILABLE"
    assert index["short_labels"]["reason"] == (
        'short_labels/config.toml: output[0].label_filename: "labels.txt" has 2 lines, but '
        "output 'SCORES' has 6 classes. Hint: one label per line, in class order"
    )
    assert index["no_labels_file"]["reason"] == (
        'no_labels_file/config.toml: output[0].label_filename: "labels.txt" does not exist '
        "in the model folder"
    )


def _refusal(server, model: str, body: dict) -> str:
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body)
    assert response.status_code == 400, response.text
    return response.json()["error"]


INPUT = {"name": "INPUT", "shape": [1, CLASSES], "datatype": "FP32", "data": [0.0] * CLASSES}


@pytest.mark.parametrize(
    ("key", "value"), [("sequence_id", -1), ("sequence_start", "yes"), ("sequence_end", 1)]
)
def test_lying_sequence_parameters_are_refused_by_name(server, key, value):
    body = {"inputs": [INPUT], "parameters": {key: value}}
    assert f"model 'scores': parameter {key} must be" in _refusal(server, "scores", body)


def test_a_model_without_sequence_batching_ignores_a_sequence_as_triton_does(client):
    data = triton.InferInput("INPUT", [1, CLASSES], "FP32")
    data.set_data_from_numpy(np.zeros((1, CLASSES), np.float32))
    result = client.infer("scores", [data], sequence_id=5, sequence_start=True)
    assert result.as_numpy("SCORES").shape == (1, CLASSES)


def test_shared_memory_parameters_are_refused_naming_the_flag(server):
    """Client shared memory is off unless --allow-client-shm true (tests/e2e/
    test_shared_memory.py has it on)."""
    off = (
        "shared_memory_region 'r': client shared memory is off on this server. Hint: start "
        "it with --allow-client-shm true"
    )
    on_input = dict(INPUT, parameters={"shared_memory_region": "r", "shared_memory_byte_size": 24})
    del on_input["data"]
    assert _refusal(server, "scores", {"inputs": [on_input]}) == (
        f"model 'scores': input 'INPUT': {off}"
    )
    output = {"name": "SCORES", "parameters": {"shared_memory_region": "r",
                                               "shared_memory_byte_size": 24}}  # fmt: skip
    assert _refusal(server, "scores", {"inputs": [INPUT], "outputs": [output]}) == (
        f"model 'scores': output 'SCORES': {off}"
    )


@pytest.mark.parametrize(
    ("count", "error"),
    [
        (-1, "classification must be an int >= 0 (classes to return)"),
        ("3", "classification must be an int >= 0 (classes to return)"),
    ],
)
def test_bad_classification_counts_are_400(server, count, error):
    body = {
        "inputs": [INPUT],
        "outputs": [{"name": "SCORES", "parameters": {"classification": count}}],
    }
    assert _refusal(server, "scores", body) == f"model 'scores': output 'SCORES': {error}"


def test_server_metadata_lists_classification(client):
    assert "classification" in client.get_server_metadata()["extensions"]


def test_the_config_document_names_the_label_file(client):
    outputs = client.get_model_config("scores")["output"]
    assert [output["label_filename"] for output in outputs] == ["labels.txt", ""]


TRITON_FOLDER = """
    platform: "onnxruntime_onnx"
    max_batch_size: 4
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "y_labels.txt" } ]
"""


def test_a_triton_folder_classifies_with_its_label_file(tmp_path):
    """config.pbtxt's label_filename feeds the same classification as config.toml's."""
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    model_files = pytest.importorskip("tests.model_files")
    folder = tmp_path / "repository" / "tiny"
    model_files.export_onnx(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(TRITON_FOLDER)
    (folder / "y_labels.txt").write_text("red\ngreen\nblue\n")
    with running_server(folder.parent, tmp_path) as server:
        values = np.random.default_rng(3).random((2, 4), dtype=np.float32)
        with triton.InferenceServerClient(server.address) as client:
            data = triton.InferInput("x", [2, 4], "FP32")
            data.set_data_from_numpy(values)
            wanted = triton.InferRequestedOutput("y", class_count=2)
            result = client.infer("tiny", [data], outputs=[wanted])
        direct = model_files.reference(values)
        got = [[text.split(":") for text in row] for row in _strings(result.as_numpy("y"))]
        wanted_rows = _expected(direct, 2, ["red", "green", "blue"], floats=True)
        # onnxruntime and torch may differ in the last bits: classes exactly, values closely.
        for row, wanted_row in zip(got, wanted_rows, strict=True):
            assert [parts[1:] for parts in row] == [w.split(":")[1:] for w in wanted_row]
            np.testing.assert_allclose(
                [float(parts[0]) for parts in row],
                [float(w.split(":")[0]) for w in wanted_row],
                atol=model_files.TOLERANCE["fp32"],
            )
