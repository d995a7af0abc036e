"""ModelInfer requests into the V2 header and tensor bytes the shared decoder takes."""

from __future__ import annotations

import numpy as np
import pytest

from reposerve.errors import ProtocolError
from reposerve.grpc import schema
from reposerve.grpc.infer import request_parts

pytestmark = pytest.mark.unit


def _request(**fields):
    return schema.message_class("inference.ModelInferRequest")(model_name="m", **fields)


@pytest.mark.parametrize(
    ("datatype", "field", "values", "dtype"),
    [
        ("BOOL", "bool_contents", [True, False, True], "<?"),
        ("INT8", "int_contents", [-128, 0, 127], "<i1"),
        ("UINT16", "uint_contents", [0, 1, 65535], "<u2"),
        ("INT64", "int64_contents", [-(2**63), 0, 2**63 - 1], "<i8"),
        ("UINT64", "uint64_contents", [0, 2**64 - 1, 7], "<u8"),
        ("FP32", "fp32_contents", [0.5, -1.25, 3.0], "<f4"),
        ("FP64", "fp64_contents", [0.1, -2.5, 1e300], "<f8"),
    ],
)
def test_typed_contents_become_the_little_endian_wire_bytes(datatype, field, values, dtype):
    request = _request()
    tensor = request.inputs.add(name="X", datatype=datatype, shape=[1, 3])
    getattr(tensor.contents, field).extend(values)
    header, raws = request_parts(request)
    assert header["inputs"] == [
        {"name": "X", "datatype": datatype, "shape": [1, 3], "parameters": {}}
    ]
    assert raws == [np.asarray(values, dtype=dtype).tobytes()]


def test_raw_contents_pass_as_they_came_and_binary_flags_are_ignored():
    request = _request(id="r", raw_input_contents=[b"\x01\x00\x00\x00"])
    tensor = request.inputs.add(name="X", datatype="INT32", shape=[1])
    tensor.parameters["binary_data_size"].int64_param = 99  # meaningless over gRPC
    request.parameters["priority"].uint64_param = 2
    request.parameters["binary_data_output"].bool_param = False
    request.outputs.add(name="Y").parameters["classification"].int64_param = 3
    header, raws = request_parts(request)
    assert raws == [b"\x01\x00\x00\x00"]
    assert header["inputs"][0]["parameters"] == {}
    assert header["parameters"] == {"priority": 2}
    assert header["outputs"] == [{"name": "Y", "parameters": {"classification": 3}}]
    assert header["id"] == "r"


def test_fp16_needs_raw_contents_and_raw_counts_must_match():
    request = _request()
    request.inputs.add(name="X", datatype="FP16", shape=[1])
    with pytest.raises(ProtocolError, match="'FP16' has no typed contents field"):
        request_parts(request)
    mixed = _request(raw_input_contents=[b"\x00\x00"])
    mixed.inputs.add(name="X", datatype="FP16", shape=[1])
    mixed.inputs.add(name="Y", datatype="FP16", shape=[1])
    with pytest.raises(ProtocolError, match="1 raw_input_contents for 2 inputs"):
        request_parts(mixed)
