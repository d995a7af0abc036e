"""label_filename: where a label file may be, and the classification top-k it feeds."""

from __future__ import annotations

import numpy as np
import pytest

from reposerve.config import parse_model_config
from reposerve.config.labels import read_labels
from reposerve.datatypes import unpack_bytes
from reposerve.errors import ConfigError
from reposerve.protocol.classification import classify
from reposerve.tensor import Tensor

pytestmark = pytest.mark.unit


def _config(output_extra: str = "", input_extra: str = "", shape: str = "[3]"):
    return parse_model_config(
        f"""
        max_batch_size = 2
        [[input]]
        name = "X"
        datatype = "FP32"
        shape = {shape}
        {input_extra}
        [[output]]
        name = "Y"
        datatype = "FP32"
        shape = {shape}
        {output_extra}
        """,
        "m/config.toml",
    )


def test_inputs_have_no_labels():
    with pytest.raises(ConfigError) as caught:
        _config(input_extra='label_filename = "labels.txt"')
    assert caught.value.message == (
        "m/config.toml: input[0].label_filename: only outputs have class labels"
    )


def test_a_label_file_must_stay_in_the_model_folder(tmp_path):
    (tmp_path / "secret").write_text("a\nb\nc\n")
    folder = tmp_path / "m"
    folder.mkdir()
    config = _config('label_filename = "../secret"')
    with pytest.raises(ConfigError) as caught:
        read_labels(folder, config, "m/config.toml")
    assert caught.value.message == (
        'm/config.toml: output[0].label_filename: "../secret" must be a file inside the model '
        "folder"
    )


def test_dynamic_outputs_take_any_number_of_labels(tmp_path):
    (tmp_path / "labels.txt").write_text("a\n")
    config = _config('label_filename = "labels.txt"', shape="[-1]")
    assert read_labels(tmp_path, config, "m/config.toml") == {"Y": ("a",)}


@pytest.mark.parametrize("datatype", ["UINT8", "INT64", "FP16", "FP64"])
def test_top_k_ranks_in_the_output_datatype(datatype):
    values = np.array(
        [[3, 250, 7, 250], [0, 1, 2, 3]], dtype=datatype.lower().replace("fp", "float")
    )
    tensor = Tensor(datatype, values.shape, values.tobytes())
    result = classify(tensor, 3, batched=True, labels=("a", "b"))
    assert result.shape == (2, 3)
    texts = [item.decode() for item in unpack_bytes(result.raw, 6)]
    first = [text.split(":")[1:] for text in texts[:3]]
    # Equal values keep the lower index first; only indices with a label get one.
    assert first == [["1", "b"], ["3"], ["2"]]
    assert [text.split(":")[1] for text in texts[3:]] == ["3", "2", "1"]
