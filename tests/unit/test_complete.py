"""Config auto-complete from a model file's own tensors."""

from __future__ import annotations

import pytest

from reposerve.config import TensorConfig, complete_config, parse_model_config
from reposerve.errors import ConfigError

pytestmark = pytest.mark.unit

LABEL = "m/config.toml"
FILE_INPUTS = [TensorConfig(name="x", datatype="FP32", shape=[-1, 3, -1])]
FILE_OUTPUTS = [TensorConfig(name="y", datatype="INT64", shape=[-1, 2])]


def _complete(text: str):
    return complete_config(parse_model_config(text, LABEL), FILE_INPUTS, FILE_OUTPUTS, LABEL)


def test_omitted_tensors_come_from_the_file_without_the_batch_axis():
    config = _complete("max_batch_size = 4")
    assert [(t.name, t.datatype, t.shape) for t in config.input] == [("x", "FP32", [3, -1])]
    assert [(t.name, t.shape) for t in config.output] == [("y", [2])]


def test_without_batching_the_file_shapes_stay_whole():
    assert _complete("max_batch_size = 0").input[0].shape == [-1, 3, -1]


def test_declared_tensors_may_narrow_dynamic_dimensions():
    config = _complete(
        'max_batch_size = 4\n[[input]]\nname = "x"\ndatatype = "FP32"\nshape = [3, 224]'
    )
    assert config.input[0].shape == [3, 224]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'max_batch_size = 4\n[[input]]\nname = "z"\ndatatype = "FP32"\nshape = [3, 1]',
            "input 'z' is not in the model file (it has: x)",
        ),
        (
            'max_batch_size = 4\n[[output]]\nname = "y"\ndatatype = "FP32"\nshape = [2]',
            "output 'y': declared FP32, the model file says INT64",
        ),
        (
            'max_batch_size = 4\n[[input]]\nname = "x"\ndatatype = "FP32"\nshape = [4, 1]',
            "input 'x': declared shape [4, 1], the model file says [3, -1]",
        ),
    ],
)
def test_disagreements_name_both_sides(text, message):
    with pytest.raises(ConfigError) as caught:
        _complete(text)
    assert caught.value.message.startswith(f"{LABEL}: {message}")


def test_batching_needs_a_dynamic_first_axis():
    fixed = [TensorConfig(name="x", datatype="FP32", shape=[1, 3])]
    with pytest.raises(ConfigError, match="max_batch_size 4 needs a dynamic first dimension"):
        complete_config(parse_model_config("max_batch_size = 4", LABEL), fixed, [], LABEL)


def test_default_max_batch_size_batches_a_model_whose_tensors_all_batch():
    """Triton's onnxruntime auto-complete (default-max-batch-size, 4 by default)."""
    config = _complete("default_max_batch_size = 4")
    assert (config.max_batch_size, config.default_max_batch_size) == (4, 0)
    assert config.dynamic_batching is not None
    assert config.input[0].shape == [3, -1]
    fixed = [TensorConfig(name="y", datatype="INT64", shape=[2, 2])]
    config = complete_config(
        parse_model_config("default_max_batch_size = 4", LABEL), FILE_INPUTS, fixed, LABEL
    )
    assert (config.max_batch_size, config.dynamic_batching) == (0, None)


def test_a_reshape_is_checked_against_the_file_in_place_of_the_shape():
    text = 'max_batch_size = 4\n[[output]]\nname = "y"\ndatatype = "INT64"\nshape = [2, 1]\n'
    config = _complete(text + "reshape = [2]\n")
    assert (config.output[0].shape, config.output[0].reshape) == ([2, 1], [2])
    with pytest.raises(ConfigError, match=r"declared reshape \[1, 2\], the model file says \[2\]"):
        _complete(text + "reshape = [1, 2]\n")
