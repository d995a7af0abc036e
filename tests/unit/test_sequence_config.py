"""[sequence_batching] in config.toml and Triton's form: the rules, the tensors the model
sees beyond the client's, and the way back to Triton's JSON."""

from __future__ import annotations

import pytest

from reposerve.config import parse_model_config
from reposerve.config.pbtxt import parse_pbtxt
from reposerve.config.sequences import client_facing, model_facing
from reposerve.config.toml_writer import to_toml
from reposerve.config.triton import to_triton
from reposerve.errors import ConfigError, ProtocolError
from reposerve.protocol.request import decode_request

pytestmark = pytest.mark.unit

LABEL = "m/config.toml"
TENSORS = """
max_batch_size = 4
[[input]]
name = "INPUT"
datatype = "INT32"
shape = [1]
[[output]]
name = "OUTPUT"
datatype = "INT32"
shape = [1]
"""
SEQUENCE = (
    TENSORS
    + """
[sequence_batching]
strategy = "oldest"
max_candidate_sequences = 16
preferred_batch_size = [2, 4]
max_queue_delay_microseconds = 100
[[sequence_batching.control_input]]
name = "START"
kind = "start"
false_true = [0, 1]
[[sequence_batching.control_input]]
name = "CORRID"
kind = "corrid"
datatype = "BYTES"
[[sequence_batching.control_input]]
name = "READY"
kind = "ready"
datatype = "FP32"
false_true = [0.0, 1.0]
[[sequence_batching.state]]
input_name = "ACC"
output_name = "ACC_OUT"
datatype = "FP32"
shape = [-1]
initial_state = { datatype = "FP32", shape = [3] }
"""
)


def test_the_model_sees_controls_and_state_the_client_does_not():
    config = parse_model_config(SEQUENCE, LABEL, folder_name="m")
    model = model_facing(config)
    assert [t.name for t in model.input] == ["INPUT", "START", "CORRID", "READY", "ACC"]
    assert [t.name for t in model.output] == ["OUTPUT", "ACC_OUT"]
    assert client_facing(model, config) == config


def test_triton_json_round_trips_through_the_pbtxt_reader():
    config = parse_model_config(SEQUENCE, LABEL, folder_name="m")
    document = to_triton("m", "python", config)
    sequence = document["sequence_batching"]
    assert sequence["oldest"]["preferred_batch_size"] == [2, 4]
    assert sequence["control_input"][1]["control"] == [
        {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_STRING"}
    ]
    assert sequence["control_input"][2]["control"][0]["fp32_false_true"] == [0.0, 1.0]
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    message = json_format.ParseDict(document, model_config_pb2.ModelConfig())  # Triton's schema
    again = parse_pbtxt(text_format.MessageToString(message), "m/config.pbtxt", "m")
    assert again.sequence_batching == config.sequence_batching


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            '[sequence_batching]\n[[sequence_batching.control_input]]\nname = "INPUT"\n'
            'kind = "start"',
            'sequence_batching.control_input[0].name: "INPUT" is already an input of the model',
        ),
        (
            '[sequence_batching]\n[[sequence_batching.control_input]]\nname = "A"\nkind = "end"'
            '\n[[sequence_batching.control_input]]\nname = "B"\nkind = "end"',
            "sequence_batching.control_input[1].kind: a second end control (one of each kind)",
        ),
        (
            '[sequence_batching]\n[[sequence_batching.control_input]]\nname = "C"\n'
            'kind = "corrid"\ndatatype = "FP32"',
            "sequence_batching.control_input[0].datatype: FP32 for a corrid control; use one "
            "of UINT64, INT64, UINT32, INT32, BYTES",
        ),
        (
            "[sequence_batching]\nmax_candidate_sequences = 4",
            "sequence_batching: preferred_batch_size and max_candidate_sequences are the "
            "oldest strategy's",
        ),
        (
            '[sequence_batching]\nstrategy = "oldest"\npreferred_batch_size = [8]',
            "sequence_batching.preferred_batch_size: 8 exceeds max_batch_size 4",
        ),
        (
            "[dynamic_batching]\n[sequence_batching]",
            "sequence_batching: a model has dynamic_batching or sequence_batching, not both",
        ),
        (
            '[sequence_batching]\n[[sequence_batching.state]]\ninput_name = "S"\n'
            'output_name = "OUTPUT"\ndatatype = "FP32"\nshape = [1]',
            'sequence_batching.state[0].output_name: output "OUTPUT" is declared otherwise',
        ),
        (
            '[sequence_batching]\n[[sequence_batching.state]]\ninput_name = "S"\n'
            'output_name = "T"\ndatatype = "FP32"\nshape = [2]\n'
            'initial_state = { datatype = "FP32", shape = [3] }',
            "sequence_batching.state[0].initial_state.shape: [3] does not fit [2]",
        ),
        ('[sequence_batching]\nstrategy = "newest"', "sequence_batching.strategy: invalid enum"),
        (  # Triton reads 0 as its default; a sequence never released would hold its slot
            "[sequence_batching]\nmax_sequence_idle_microseconds = 0",
            "sequence_batching.max_sequence_idle_microseconds: expected int >= 1",
        ),
        (
            '[sequence_batching]\n[[sequence_batching.state]]\ninput_name = "S"\n'
            'output_name = "T"\ndatatype = "BYTES"\nshape = [1]\n'
            'initial_state = { datatype = "BYTES", shape = [1], data_file = "f" }',
            "sequence_batching.state[0].initial_state.data_file: a BYTES state starts empty",
        ),
        *(  # read from <model>/initial_state/, never from outside the model folder
            (
                '[sequence_batching]\n[[sequence_batching.state]]\ninput_name = "S"\n'
                'output_name = "T"\ndatatype = "FP32"\nshape = [1]\n'
                f'initial_state = {{ datatype = "FP32", shape = [1], data_file = "{name}" }}',
                f'sequence_batching.state[0].initial_state.data_file: "{name}" must name a '
                "file in the model's initial_state folder (a relative path, no '..')",
            )
            for name in ("/etc/passwd", "../../../etc/passwd", "a/../../b", "")
        ),
    ],
)
def test_sequence_rules_name_the_key(extra, message):
    with pytest.raises(ConfigError) as caught:
        parse_model_config(TENSORS + extra, LABEL, folder_name="m")
    assert caught.value.message.startswith(f"{LABEL}: {message}")


@pytest.mark.parametrize(
    ("pbtxt", "message"),
    [
        (
            "sequence_batching { oldest { preserve_ordering: true } }",
            "sequence_batching.oldest.preserve_ordering: not supported by reposerve",
        ),
        (
            "sequence_batching { direct { minimum_slot_utilization: 0.5 } }",
            "sequence_batching.direct.minimum_slot_utilization: not supported by reposerve",
        ),
        (
            'sequence_batching { control_input [ { name: "S" } ] }',
            "sequence_batching.control_input[0].control: give exactly one control",
        ),
    ],
)
def test_what_triton_has_and_reposerve_not_is_named(pbtxt, message):
    with pytest.raises(ConfigError) as caught:
        parse_pbtxt(pbtxt, "m/config.pbtxt", "m")
    assert message in caught.value.message


CONFIG = parse_model_config(TENSORS, LABEL, folder_name="m")
BODY = b'{"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]'


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ('{"sequence_id": -1}', "sequence_id must be an unsigned 64-bit int or a string"),
        ('{"sequence_id": 18446744073709551616}', "sequence_id must be an unsigned 64-bit"),
        ('{"sequence_id": 1.5}', "sequence_id must be an unsigned 64-bit int or a string"),
        ('{"sequence_id": 1, "sequence_start": 1}', "sequence_start must be a bool"),
        ('{"sequence_id": 1, "sequence_end": "yes"}', "sequence_end must be a bool"),
    ],
)
def test_lying_sequence_parameters_are_refused(parameters, message):
    with pytest.raises(ProtocolError, match=message):
        decode_request(BODY + b', "parameters": ' + parameters.encode() + b"}", None, CONFIG, "m")


def test_sequence_parameters_are_the_servers_not_the_models():
    body = BODY + b', "parameters": {"sequence_id": "a", "sequence_start": true, "x": 1}}'
    request = decode_request(body, None, CONFIG, "m")
    assert (request.sequence_id, request.sequence_start, request.sequence_end) == ("a", True, False)
    assert request.parameters == {"x": 1}


def test_convert_writes_it_as_tables_that_read_back_the_same():
    config = parse_model_config(SEQUENCE, LABEL, folder_name="m")
    written = to_toml(config)
    assert "[[sequence_batching.control_input]]" in written
    assert "[[sequence_batching.state]]" in written
    assert parse_model_config(written, LABEL, folder_name="m") == config
