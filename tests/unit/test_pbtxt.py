"""Triton's config.pbtxt read into reposerve's config: fields map onto config.toml's, and what
has no equivalent is an error naming the field (that the schema is Triton's own is
tests/unit/test_protos.py's to show)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reposerve.config import parse_model_config
from reposerve.config.pbtxt import parse_pbtxt
from reposerve.config.toml_writer import to_toml
from reposerve.errors import ConfigError

pytestmark = pytest.mark.unit

ADD_SUB = """
name: "add_sub"
backend: "python"
max_batch_size: 8
version_policy: { specific: { versions: [ 1 ] } }
input [
  { name: "INPUT0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ -1 ] optional: true }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { name: "cpus" kind: KIND_CPU count: 2 } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  default_queue_policy { max_queue_size: 5 default_timeout_microseconds: 3000 }
}
parameters { key: "intra_op_threads" value: { string_value: "4" } }
parameters { key: "stage_next_batch" value: { string_value: "false" } }
model_warmup [ {
  name: "zeros" batch_size: 2 count: 2
  inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } }
} ]
"""


def test_a_triton_config_maps_onto_the_config_toml_fields():
    config = parse_pbtxt(ADD_SUB, "add_sub/config.pbtxt", folder_name="add_sub")
    assert config.backend == "python" and config.max_batch_size == 8
    assert config.version_policy.specific == [1]
    assert [(t.name, t.datatype, t.shape, t.optional) for t in config.input] == [
        ("INPUT0", "FP32", [4], False),
        ("INPUT1", "BYTES", [-1], True),
    ]
    assert [(g.kind, g.count) for g in config.instance_group] == [("cpu", 2)]
    batching = config.dynamic_batching
    assert batching is not None
    assert batching.preferred_batch_size == [4, 8]
    assert batching.max_queue_delay_microseconds == 100 and batching.preserve_ordering
    assert batching.max_queue_size == 5 and batching.default_timeout_microseconds == 3000
    assert config.parameters == {"intra_op_threads": 4, "stage_next_batch": False}
    assert [(w.batch_size, w.inputs) for w in config.warmup] == [(2, {"INPUT0": "random"})] * 2


def test_a_decoupled_transaction_policy_is_config_tomls_decoupled():
    config = parse_pbtxt("model_transaction_policy { decoupled: true }", "m/config.pbtxt")
    assert config.decoupled
    assert not parse_pbtxt("model_transaction_policy { }", "m/config.pbtxt").decoupled


def test_an_instance_group_without_kind_is_tritons_kind_auto():
    text = "instance_group [ { count: 2 gpus: [ 0 ] }, { kind: KIND_AUTO } ]"
    config = parse_pbtxt(text, "m/config.pbtxt")
    assert [(g.kind, g.count, g.gpus) for g in config.instance_group] == [
        ("auto", 2, [0]),
        ("auto", 1, None),
    ]


def test_kind_model_groups_are_tritons_model_decides_the_device():
    config = parse_pbtxt("instance_group [ { kind: KIND_MODEL count: 2 } ]", "m/config.pbtxt")
    assert [(g.kind, g.count) for g in config.instance_group] == [("model", 2)]


def test_reshape_on_inputs_and_outputs_is_tritons_reshape():
    text = """
    max_batch_size: 8
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 4 ] reshape: { shape: [ 1, 3, 2, 2 ] } } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
    default_model_filename: "densenet.onnx"
    """
    config = parse_pbtxt(text, "m/config.pbtxt")
    assert [(t.shape, t.reshape) for t in (*config.input, *config.output)] == [
        ([3, 4], [1, 3, 2, 2]),
        ([1], []),
    ]
    assert config.default_model_filename == "densenet.onnx"
    toml = parse_model_config(
        '[[input]]\nname = "x"\ndatatype = "FP32"\nshape = [3, 4]\nreshape = [12]\n',
        "m/config.toml",
    )
    assert toml.input[0].reshape == [12]
    assert parse_model_config(to_toml(config), "m/config.toml") == config


def test_tritons_onnxruntime_parameters_become_reposerves_and_the_rest_are_refused():
    text = """
    platform: "onnxruntime_onnx"
    parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
    parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
    """
    config = parse_pbtxt(text, "m/config.pbtxt")
    assert config.parameters == {
        "intra_op_threads": 2,
        "onnxruntime": {"cuda": {"cudnn_conv_algo_search": "HEURISTIC"}},
    }
    refused = (
        'backend: "pytorch"\nparameters { key: "INFERENCE_MODE" value: { string_value: "true" } }'
    )
    with pytest.raises(ConfigError, match="parameters.INFERENCE_MODE: Triton's torch backend"):
        parse_pbtxt(refused, "m/config.pbtxt")


def test_libtorch_positional_names_are_ordered_by_their_index():
    text = """
    platform: "pytorch_libtorch"
    max_batch_size: 4
    input [ { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 2 ] },
            { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 3 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """
    config = parse_pbtxt(text, "m/config.pbtxt")
    assert config.backend == "torch"
    assert [tensor.name for tensor in config.input] == ["INPUT__0", "INPUT__1"]


def test_tensorrt_accelerator_becomes_onnxruntime_provider_options():
    text = """
    platform: "onnxruntime_onnx"
    optimization { execution_accelerators { gpu_execution_accelerator : [ {
      name : "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
      parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] } }
    """
    config = parse_pbtxt(text, "m/config.pbtxt")
    assert config.parameters == {
        "onnxruntime": {"tensorrt": {"trt_fp16_enable": True, "trt_max_workspace_size": 1 << 30}}
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'name: "m"\nresponse_cache { enable: true }',
            "m/config.pbtxt: 2:1: response_cache: not supported by reposerve",
        ),
        (
            'platform: "tensorrt_plan"',
            "m/config.pbtxt: platform: 'tensorrt_plan' is not served by reposerve",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] is_shape_tensor: true } ]',
            "m/config.pbtxt: input[0].is_shape_tensor: not supported by reposerve",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 3 ] } } ]',
            "m/config.pbtxt: input[0].reshape: [3] holds 3 elements, shape [4] holds 4",
        ),
        (
            'default_model_filename: "../model.onnx"',
            "m/config.pbtxt: default_model_filename: expected str matching regex",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'model_warmup [ { batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 '
            'dims: [ 1 ] input_data_file: "x.bin" } } } ]',
            "m/config.pbtxt: model_warmup[0].inputs.x: only zero_data and random_data",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]\nmodel_warmup [ { '
            'batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 224 ] '
            "zero_data: true } } } ]",
            "model_warmup[0].inputs.x.dims: [224]: reposerve warms inputs up at their shape "
            "with -1 as 1 ([1])",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\nmodel_warmup [ { '
            'batch_size: 1 inputs { key: "x" value: { data_type: TYPE_INT32 dims: [ 4 ] '
            "zero_data: true } } } ]",
            "model_warmup[0].inputs.x.data_type: TYPE_INT32, but the input is FP32",
        ),
        (
            "dynamic_batching { default_queue_policy { timeout_action: DELAY } }",
            "timeout_action: DELAY is not supported (REJECT is)",
        ),
        ("max_batch_size: -1", "m/config.pbtxt: max_batch_size: expected int >= 0, got -1"),
        ('name: "other"', 'name: "other" does not match the model folder "m"'),
        ("max_batch_size: { }", "m/config.pbtxt: 1:17"),
    ],
)
def test_what_has_no_equivalent_is_an_error_naming_the_field(text, message):
    with pytest.raises(ConfigError) as caught:
        parse_pbtxt(text, "m/config.pbtxt", folder_name="m")
    assert message in caught.value.message


def test_convert_writes_a_config_toml_that_loads_as_the_same_config():
    text = (
        ADD_SUB
        + """
    optimization { execution_accelerators { gpu_execution_accelerator : [ {
      name : "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ] } }
    """
    )
    config = parse_pbtxt(text, "add_sub/config.pbtxt", folder_name="add_sub")
    written = to_toml(config)
    assert "[parameters.onnxruntime.tensorrt]\ntrt_fp16_enable = true" in written
    assert "priority_levels" not in written  # defaults are left out
    assert parse_model_config(written, "add_sub/config.toml", "add_sub") == config


README_REFUSALS = re.compile(
    r"`(?P<message>(?P<label>\S+/config\.pbtxt): 2:1: (?P<field>\w+): not supported by[^`]*)`"
)


def test_fields_the_readme_calls_unsupported_are_refused_in_those_words():
    """The README's example of a refused field stays true as fields gain support: it once
    named ``sequence_batching`` long after sequence batching landed."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    quoted = list(README_REFUSALS.finditer(readme))
    assert quoted, "the README quotes no refused config.pbtxt field"
    for match in quoted:
        with pytest.raises(ConfigError) as refused:
            parse_pbtxt(f'name: "m"\n{match["field"]} {{ }}', match["label"])
        assert str(refused.value) == " ".join(match["message"].split())
