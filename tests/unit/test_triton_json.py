"""Triton's model-config JSON back to a ModelConfig: what ``/config`` writes reads back as
the same config, Triton's other JSON spellings read too, and what reposerve has no
equivalent for is an error naming the field."""

from __future__ import annotations

import json

import msgspec
import pytest

from reposerve.config import parse_model_config
from reposerve.config.triton_json import parse_triton_config
from reposerve.config.triton_parameters import decode_value, encode_value
from reposerve.errors import ConfigError
from reposerve.protocol.documents import model_config
from tests.toy_models import EVERY_SETTING

pytestmark = pytest.mark.unit

LABEL = "load 'm': parameters.config"


def test_config_document_reads_back_as_the_same_config():
    config = parse_model_config(EVERY_SETTING, "m/config.toml")
    document = model_config("m", "python", config)
    assert parse_triton_config(document.decode(), LABEL, "m") == msgspec.structs.replace(
        config, name="m", backend="python"
    )


def test_protobuf_json_spellings_read():
    """What json_format.MessageToDict writes: lowerCamelCase names, 64-bit ints as strings,
    fields at their defaults left out."""
    document = {
        "name": "m",
        "backend": "python",
        "maxBatchSize": 4,
        "input": [{"name": "INPUT", "dataType": "TYPE_FP32", "dims": ["16"]}],
        "output": [{"name": "OUTPUT", "dataType": "TYPE_FP32", "dims": ["16"]}],
        "dynamicBatching": {"maxQueueDelayMicroseconds": "100"},
        "instanceGroup": [{"count": 2, "kind": "KIND_CPU"}],
        "parameters": {"myKey": {"stringValue": "4"}},
    }
    config = parse_triton_config(json.dumps(document), LABEL, "m")
    assert config.max_batch_size == 4
    assert config.input[0].shape == [16]
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert config.instance_group is not None and config.instance_group[0].count == 2
    assert config.parameters == {"myKey": 4}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"response_cache": {"enable": True}},
            f"{LABEL}: response_cache: not supported by reposerve",
        ),
        (
            {"parameters": {"reposerve.precision": {"string_value": "fp16"}}},
            f"{LABEL}: parameters.reposerve.precision: unknown reposerve setting (known: "
            "reposerve.optimization.precision, reposerve.execution.timeout_seconds, "
            "reposerve.execution.isolate_failures, reposerve.lifecycle.pinned, "
            "reposerve.instance_group.<i>.cpus, reposerve.dynamic_batching.{pad,buckets,"
            "lengths_input,lengths_datatype,unpad}, reposerve.openai.{kind,chat_template,input,"
            "output,max_tokens})",
        ),
        (
            {"parameters": {"reposerve.optimization.precision": {"string_value": "fp8"}}},
            f"{LABEL}: optimization.precision: invalid enum value 'fp8'",
        ),
        ({"name": "other"}, f'{LABEL}: name: "other" does not match the model folder "m"'),
    ],
)
def test_what_has_no_equivalent_is_an_error_naming_it(document, message):
    with pytest.raises(ConfigError) as caught:
        parse_triton_config(json.dumps({"backend": "python"} | document), LABEL, "m")
    assert caught.value.message == message


def test_not_json():
    with pytest.raises(ConfigError, match=f"^{LABEL}: not valid JSON: "):
        parse_triton_config("max_batch_size: 4", LABEL, "m")


@pytest.mark.parametrize(
    "value", ["plain", "3", "true", '"quoted"', "", 4, 2.5, False, {"a": [1, "x"]}, [1, 2]]
)
def test_parameter_values_round_trip(value):
    assert decode_value(encode_value(value)) == value
