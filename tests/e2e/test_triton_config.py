"""``GET .../config`` parses strictly into Triton's ModelConfig protobuf (what Model Analyzer
and Triton's other tools do with it), for every bundled model and for configs that use
every reposerve setting; reposerve-only settings travel in ``parameters``."""

from __future__ import annotations

import httpx
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from tests.model_files import export_onnx
from tests.server import running_server
from tests.toy_models import EVERY_SETTING, PLUS_ONE, write_model

pytestmark = pytest.mark.e2e


def strict_parse(body: bytes) -> model_config_pb2.ModelConfig:
    return json_format.Parse(body, model_config_pb2.ModelConfig(), ignore_unknown_fields=False)


def test_bundled_models_parse_strictly(bundled_server):
    index = httpx.post(f"{bundled_server.url}/v2/repository/index", json={"ready": True}).json()
    names = sorted({entry["name"] for entry in index})
    assert {"add_sub", "identity_bytes"} <= set(names)
    for name in names:
        reply = httpx.get(f"{bundled_server.url}/v2/models/{name}/config")
        assert reply.status_code == 200, reply.text
        config = strict_parse(reply.content)
        assert config.name == name
        assert config.parameters["reposerve.optimization.precision"].string_value == "fp32"


def test_every_setting_parses_strictly_and_is_carried(repository, tmp_path):
    write_model(repository, "everything", EVERY_SETTING, PLUS_ONE)
    write_model(repository, "everything", EVERY_SETTING, PLUS_ONE, version=2)
    onnx = repository / "tiny_onnx"
    (onnx / "1").mkdir(parents=True)
    (onnx / "config.toml").write_text('backend = "onnxruntime"\nmax_batch_size = 4\n')
    export_onnx(onnx / "1" / "model.onnx")
    with running_server(repository, tmp_path) as server:
        for name, version in (("everything", "1"), ("everything", "2"), ("tiny_onnx", "1")):
            reply = httpx.get(f"{server.url}/v2/models/{name}/versions/{version}/config")
            assert reply.status_code == 200, reply.text
            strict_parse(reply.content)
        config = strict_parse(httpx.get(f"{server.url}/v2/models/everything/config").content)
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    assert parameters == {
        "max_inflight_batches": "2",
        "note": '"3"',  # a string that reads as JSON is quoted, so it stays a string
        "label": "plain text",
        "table": '{"a":1,"b":[true,"x"]}',
        "reposerve.optimization.precision": "fp16",
        "reposerve.execution.timeout_seconds": "30.5",
        "reposerve.execution.isolate_failures": "false",
        "reposerve.lifecycle.pinned": "true",
        "reposerve.instance_group.0.cpus": "[0]",
    }
    assert config.version_policy.WhichOneof("policy_choice") == "all"
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert config.instance_group[0].count == 2
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [2, 4]
    assert batching.max_queue_delay_microseconds == 300
    assert batching.default_queue_policy.max_queue_size == 9
    assert batching.default_queue_policy.default_timeout_microseconds == 5000000
    assert (batching.priority_levels, batching.default_priority_level) == (2, 1)
    assert config.model_warmup[0].batch_size == 2
    assert config.model_warmup[0].inputs["INPUT"].random_data
