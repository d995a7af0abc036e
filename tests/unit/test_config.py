"""config.toml loading: defaults, and errors that name the file, the key and the reason."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reposerve.config import parse_model_config
from reposerve.config.validate import validate_model_config
from reposerve.errors import ConfigError

pytestmark = pytest.mark.unit

LABEL = "add_sub/config.toml"


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_model_config(text, LABEL, folder_name="add_sub")
    return caught.value.message


def test_defaults():
    config = parse_model_config("", LABEL)
    assert config.max_batch_size == 0
    assert config.version_policy.latest is None and config.version_policy.all is None
    assert config.instance_group is None  # placement applies Triton's default (per GPU)
    assert config.dynamic_batching is None
    assert config.optimization.precision == "fp32"


def test_full_example_parses():
    config = parse_model_config(
        """
        backend = "python"
        max_batch_size = 32
        version_policy = { specific = [1, 3] }
        [[input]]
        name = "input"
        datatype = "FP32"
        shape = [3, -1]
        [[output]]
        name = "logits"
        datatype = "FP32"
        shape = [1000]
        [[instance_group]]
        kind = "gpu"
        count = 2
        gpus = [0, 1]
        [dynamic_batching]
        preferred_batch_size = [8, 16]
        max_queue_delay_microseconds = 2000
        priority_levels = 2
        default_priority_level = 2
        [optimization]
        precision = "fp16"
        [[warmup]]
        batch_size = 8
        inputs = { input = "random" }
        [parameters]
        intra_op_threads = 2
        """,
        LABEL,
        folder_name="add_sub",
    )
    assert config.version_policy.specific == [1, 3]
    assert config.input[0].shape == [3, -1]
    assert config.dynamic_batching.preferred_batch_size == [8, 16]
    assert config.parameters == {"intra_op_threads": 2}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "max_batch_size = 8\n[dynamic_batching]\nmax_queue_delay_microseconds = -5",
            "dynamic_batching.max_queue_delay_microseconds: expected int >= 0, got -5",
        ),
        ("max_batch_sizee = 1", "max_batch_sizee: unknown key"),
        ('max_batch_size = "8"', "max_batch_size: expected int, got str"),
        ('[[input]]\nname = "a"\nshape = [1]', "input[0].datatype: required key is missing"),
        (
            '[[input]]\nname = "a"\ndatatype = "FP33"\nshape = [1]',
            "input[0].datatype: invalid enum value 'FP33'",
        ),
        (
            '[[input]]\nname = "a"\ndatatype = "FP32"\nshape = [-2]',
            "input[0].shape[0]: expected int >= -1, got -2",
        ),
        ('backend = "tensorflow"', "backend: invalid enum value 'tensorflow'"),
        ("[[instance_group]]\ncount = 0", "instance_group[0].count: expected int >= 1, got 0"),
        ("instance_group = []", "instance_group: expected array of length >= 1, got []"),
        (
            "[[instance_group]]\ncpus = []",
            "instance_group[0].cpus: expected array of length >= 1, got []",
        ),
        ("[[instance_group]]\ncpus = [-1]", "instance_group[0].cpus[0]: expected int >= 0, got -1"),
        (
            "[[instance_group]]\ngpus = [0]",
            'instance_group[0].gpus: a kind = "cpu" group runs on no GPU. Hint: remove gpus, '
            'or use kind = "gpu" (or "auto")',
        ),
        (
            '[[instance_group]]\nkind = "model"\ngpus = [0]',
            'instance_group[0].gpus: a kind = "model" group picks its own device. Hint: '
            'remove gpus, or use kind = "gpu"',
        ),
        (
            "version_policy = { latest = 1, all = true }",
            "version_policy: set one of latest, all, specific (got latest, all)",
        ),
        (
            "version_policy = { all = false }",
            "version_policy.all: must be true when given (use latest or specific instead)",
        ),
        ('name = "other"', 'name: "other" does not match the model folder "add_sub"'),
        (
            '[[input]]\nname = "a"\ndatatype = "FP32"\nshape = [1]\n' * 2,
            'input[1].name: duplicate input "a"',
        ),
        (
            "[dynamic_batching]",
            "dynamic_batching: needs max_batch_size > 0 (0 means no batch dimension)",
        ),
        (
            "max_batch_size = 8\n[dynamic_batching]\npreferred_batch_size = [4, 16]",
            "dynamic_batching.preferred_batch_size: 16 exceeds max_batch_size 8",
        ),
        (
            "max_batch_size = 4\n[[warmup]]\nbatch_size = 5",
            "warmup[0].batch_size: 5 exceeds the limit 4",
        ),
        ('[optimization]\nprecision = "int8"', "optimization.precision: invalid enum value 'int8'"),
        ("max_batch_size = \n[x]", "invalid TOML: Invalid value (at line 1, column 18)"),
    ],
)
def test_errors_name_file_key_and_reason(text, message):
    assert _error(text) == f"{LABEL}: {message}"


KEYS = [
    "name", "backend", "max_batch_size", "version_policy", "input", "output", "instance_group",
    "dynamic_batching", "optimization", "warmup", "parameters", "latest", "all", "specific",
    "datatype", "shape", "kind", "count", "gpus", "cpus", "preferred_batch_size", "precision",
    "max_queue_delay_microseconds", "batch_size", "inputs", "optional", "typo",
]  # fmt: skip
toml_values = st.recursive(
    st.booleans() | st.integers(-3, 40) | st.sampled_from(["FP32", "cpu", "gpu", "x", "fp16", ""]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), toml_values, max_size=6))
def test_any_document_is_a_config_or_a_config_error(raw):
    try:
        validate_model_config(raw, LABEL, folder_name="add_sub")
    except ConfigError as exc:
        assert exc.message.startswith(f"{LABEL}: ")
        assert ": " in exc.message[len(LABEL) + 2 :] or "invalid" in exc.message
