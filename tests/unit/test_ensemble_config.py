"""An ensemble's config alone: its steps must form a DAG over its tensors, and Triton's
ensemble_scheduling reads as the same steps."""

from __future__ import annotations

import textwrap

import pytest

from reposerve.config import parse_model_config
from reposerve.config.pbtxt import parse_pbtxt
from reposerve.errors import ConfigError
from tests.toy_models import ensemble_head

pytestmark = pytest.mark.unit

HEAD = ensemble_head(8)


def _step(model: str, inputs: str, outputs: str) -> str:
    return (
        f'\n[[step]]\nmodel = "{model}"\ninput_map = {{ {inputs} }}\noutput_map = {{ {outputs} }}\n'
    )


def test_a_diamond_is_a_valid_ensemble():
    text = textwrap.dedent(HEAD) + (
        _step("join", 'A = "a", B = "b"', 'S = "OUT"')
        + _step("left", 'X = "IN"', 'Y = "a"')
        + _step("right", 'X = "IN"', 'Y = "b"')
    )
    config = parse_model_config(text, "d/config.toml")
    assert [step.model for step in config.step] == ["join", "left", "right"]
    assert config.step[0].version == -1


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        ("", "step: an ensemble needs at least one step"),
        (_step("m", 'X = "nowhere"', 'Y = "OUT"'), 'input_map.X: "nowhere" is neither an ensemble'),
        (
            _step("m", 'X = "IN"', 'Y = "OUT"') + _step("n", 'X = "IN"', 'Y = "OUT"'),
            'step[1].output_map: "OUT" is written by step[0] already',
        ),
        (_step("m", 'X = "IN"', 'Y = "other"'), 'output: "OUT" is written by no step'),
        (
            _step("m", 'X = "a"', 'Y = "b"')
            + _step("n", 'X = "b"', 'Y = "a"')
            + _step("o", 'X = "IN"', 'Y = "OUT"'),
            "the steps form a cycle: step[0] -> step[1] -> step[0]",
        ),
        (_step("m", 'X = "IN"', 'Y = "IN"'), 'step[0].output_map: "IN" is an ensemble input'),
        (_step("m", "", 'Y = "OUT"'), 'input: "IN" is read by no step'),
        (
            _step("m", 'X = "IN"', 'Y = "OUT"') + "[dynamic_batching]\n",
            "dynamic_batching: an ensemble has none",
        ),
    ],
)
def test_steps_that_do_not_form_a_dag_are_refused_naming_the_step_and_tensor(steps, problem):
    with pytest.raises(ConfigError, match="e/config.toml: ") as caught:
        parse_model_config(textwrap.dedent(HEAD) + steps, "e/config.toml")
    assert problem in caught.value.message


def test_steps_need_an_ensemble():
    text = 'backend = "python"\n' + _step("m", 'X = "IN"', 'Y = "OUT"')
    with pytest.raises(ConfigError, match="step: only an ensemble has steps"):
        parse_model_config(text, "p/config.toml")


def test_tritons_ensemble_scheduling_reads_as_steps():
    text = """
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling {
          step [
            {
              model_name: "pre"
              model_version: -1
              input_map { key: "X" value: "IN" }
              output_map { key: "Y" value: "mid" }
            },
            {
              model_name: "net"
              model_version: 2
              input_map { key: "X" value: "mid" }
              output_map { key: "Y" value: "OUT" }
            }
          ]
        }
    """
    config = parse_pbtxt(textwrap.dedent(text), "e/config.pbtxt", folder_name="e")
    assert config.backend == "ensemble"
    assert [(s.model, s.version, s.input_map, s.output_map) for s in config.step] == [
        ("pre", -1, {"X": "IN"}, {"Y": "mid"}),
        ("net", 2, {"X": "mid"}, {"Y": "OUT"}),
    ]


def test_an_ensemble_converts_to_config_toml_steps_that_load_the_same():
    from reposerve.config.toml_writer import to_toml

    text = textwrap.dedent(HEAD) + _step("m", 'X = "IN"', 'Y = "OUT"')
    config = parse_model_config(text, "e/config.toml")
    written = to_toml(config)
    assert "[[step]]" in written
    assert parse_model_config(written, "e/config.toml") == config


def test_an_ensembles_inputs_are_all_required():
    text = textwrap.dedent(HEAD).replace("shape = [4]\n", "shape = [4]\noptional = true\n", 1)
    with pytest.raises(ConfigError, match=r"input\[0\].optional: an ensemble's inputs are all"):
        parse_model_config(text + _step("m", 'X = "IN"', 'Y = "OUT"'), "e/config.toml")
