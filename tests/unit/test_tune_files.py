"""What tune reads and writes without a server: sample requests from --inputs (and the
errors that say what to fix), V2 answers decoded, the recommended config and its atomic
write."""

from __future__ import annotations

import json
import os

import msgspec
import numpy as np
import pytest

from reposerve.config import load_model_config
from reposerve.config.schema import InstanceGroup
from reposerve.datatypes import pack_bytes
from reposerve.errors import TuneError
from reposerve.tune.client import decode_outputs
from reposerve.tune.configs import recommend, write
from reposerve.tune.requests import binary_request, sample_requests
from reposerve.tune.space import Machine, knobs_for

pytestmark = pytest.mark.unit

IMAGE_MODEL = {
    "name": "image",
    "inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [-1, 1]}],
}


def test_a_folder_gives_one_request_per_file(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8first")
    (tmp_path / "b.jpg").write_bytes(b"\xff\xd8second")
    (tmp_path / ".hidden").write_bytes(b"skipped")
    requests = sample_requests(tmp_path, IMAGE_MODEL, batched=True)
    assert len(requests) == 2
    length = int(requests[0].headers["Inference-Header-Content-Length"])
    header = json.loads(requests[0].body[:length])
    assert header["inputs"][0]["shape"] == [1, 1]
    assert requests[0].body[length:] == pack_bytes([b"\xff\xd8first"])


def test_a_folder_needs_one_bytes_input(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"x")
    tensors = {"name": "m", "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]}
    with pytest.raises(TuneError, match="one BYTES input; m takes X FP32: give a file"):
        sample_requests(tmp_path, tensors, batched=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TuneError, match="holds no file"):
        sample_requests(empty, IMAGE_MODEL, True)


@pytest.mark.parametrize("form", ["object", "list", "lines"])
def test_a_file_of_v2_requests(tmp_path, form):
    request = {"inputs": [{"name": "X", "shape": [3, 4], "datatype": "FP32", "data": [0] * 12}]}
    path = tmp_path / "requests.json"
    if form == "object":
        path.write_text(json.dumps(request))
    elif form == "list":
        path.write_text(json.dumps([request, request]))
    else:
        path.write_text(json.dumps(request) + "\n\n" + json.dumps(request) + "\n")
    requests = sample_requests(path, {"name": "m", "inputs": []}, batched=True)
    assert len(requests) == (1 if form == "object" else 2)
    assert requests[0].batch == 3
    assert json.loads(requests[0].body) == request


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "expected V2 requests as JSON"),
        ('{"inputs": 3}', "request 0: not a V2 request"),
        ("[]", "holds no request"),
    ],
)
def test_a_bad_file_says_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "requests.json"
    path.write_text(text)
    with pytest.raises(TuneError, match=message):
        sample_requests(path, {"name": "m", "inputs": []}, batched=True)
    with pytest.raises(TuneError, match="no such file or folder"):
        sample_requests(tmp_path / "absent", {"name": "m", "inputs": []}, batched=True)


def test_answers_decode_from_json_and_binary():
    json_answer = msgspec.json.encode(
        {
            "outputs": [
                {"name": "A", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]},
                {"name": "S", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
            ]
        }
    )
    outputs = decode_outputs(json_answer, None)
    assert outputs["A"].tolist() == [1.5, 2.5] and outputs["S"].tolist() == [b"hi"]
    blob = np.arange(6, dtype=np.int64).tobytes()
    strings = pack_bytes([b"x", b"yz"])
    header = msgspec.json.encode(
        {
            "outputs": [
                {"name": "B", "datatype": "INT64", "shape": [2, 3],
                 "parameters": {"binary_data_size": len(blob)}},
                {"name": "S", "datatype": "BYTES", "shape": [2],
                 "parameters": {"binary_data_size": len(strings)}},
            ]
        }
    )  # fmt: skip
    outputs = decode_outputs(header + blob + strings, str(len(header)))
    assert outputs["B"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert outputs["S"].tolist() == [b"x", b"yz"]


def test_binary_requests_carry_their_batch():
    request = binary_request([("X", "FP32", [4, 2], bytes(32))])
    assert request.batch == 4
    assert request.payload("h", "m").startswith(b"POST /v2/models/m/infer HTTP/1.1\r\n")


SHIPPED = """\
# Hand-written: the comment stays in the diff's context.
backend = "python"
max_batch_size = 32

[[input]]
name = "X"
datatype = "FP32"
shape = [4]

[[output]]
name = "Y"
datatype = "FP32"
shape = [4]
"""


def _recommendation(folder, chosen_batch: int):
    served = load_model_config(folder / "config.toml")
    served = msgspec.structs.replace(served, instance_group=[InstanceGroup(kind="cpu")])
    knobs, _ = knobs_for(served, "python", Machine(cores=2, gpus=0))
    baseline = {"m": {knob.name: knob.read(served) for knob in knobs}}
    chosen = {"m": {**baseline["m"], "max_batch_size": chosen_batch}}
    return recommend("m", served, knobs, baseline, chosen, folder)


def test_the_recommendation_changes_only_what_the_search_chose(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.toml").write_text(SHIPPED)
    recommendation = _recommendation(folder, 8)
    assert "+max_batch_size = 8" in recommendation.diff
    assert "+[dynamic_batching]" in recommendation.diff
    assert "instance_group" not in recommendation.text  # served-only values stay out
    assert (folder / "config.toml").read_text() == SHIPPED  # nothing written without --write
    unchanged = _recommendation(folder, 1)
    assert unchanged.diff == "" and unchanged.text == SHIPPED


def test_write_replaces_in_one_rename_and_keeps_the_previous(tmp_path, monkeypatch):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.toml").write_text(SHIPPED)
    recommendation = _recommendation(folder, 8)
    renames = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renames.append((a, b)), real(a, b)))
    target = write(recommendation)
    assert target == folder / "config.toml"
    assert len(renames) == 1 and renames[0][1] == target  # the file changes in one rename
    assert target.read_text() == recommendation.text
    assert (folder / "config.toml.before-tune").read_text() == SHIPPED
    assert load_model_config(target).max_batch_size == 8
    assert sorted(p.name for p in folder.iterdir()) == ["config.toml", "config.toml.before-tune"]


def test_write_keeps_the_file_mode(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.toml").write_text(SHIPPED)
    (folder / "config.toml").chmod(0o644)
    target = write(_recommendation(folder, 8))
    assert target.stat().st_mode & 0o777 == 0o644
