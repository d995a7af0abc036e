"""Hostile bytes on the gRPC port, over raw channels: a message protobuf cannot parse is
INVALID_ARGUMENT (not UNKNOWN), and inside a ModelStreamInfer call it costs only itself
(the requests around it get their responses, the stream goes on); an error that echoes a
huge client string is cut to fit the client's trailers; large messages, answered or
refused, leave the front's memory where it was once the front is quiet."""

from __future__ import annotations

import time

import grpc
import pytest

from reposerve.grpc import schema
from tests.server import start_server
from tests.toy_models import PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e

SERVICE = "/inference.GRPCInferenceService"
BYTES_IN = """
    max_batch_size = 0
    [[input]]
    name = "INPUT"
    datatype = "UINT8"
    shape = [-1]
    [[output]]
    name = "OUTPUT"
    datatype = "UINT8"
    shape = [1]
"""
FIRST_BYTE = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"][:1]}
"""
BIG = 64 << 20
# A field 1 (model_name, a string) whose length runs past the end of the message.
GARBAGE = b"\x0a\xff\xff\xff\x0f" + b"x" * 16


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    write_model(root, "plus_one", vector_config(size=2), PLUS_ONE)
    write_model(root, "first_byte", BYTES_IN, FIRST_BYTE)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


def _request(model: str = "plus_one", request_id: str = "") -> bytes:
    request = schema.message_class("inference.ModelInferRequest")(model_name=model, id=request_id)
    tensor = request.inputs.add(name="INPUT", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    return request.SerializeToString()


def test_undecodable_unary_messages_are_invalid_argument(server):
    with grpc.insecure_channel(server.grpc_address) as channel:
        for method in ("ModelInfer", "ModelMetadata", "RepositoryModelLoad"):
            call = channel.unary_unary(f"{SERVICE}/{method}")  # bytes in, bytes out
            with pytest.raises(grpc.RpcError) as caught:
                call(GARBAGE, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert f"could not decode the {method}Request message" in caught.value.details()
        # The server took no harm.
        answer = channel.unary_unary(f"{SERVICE}/ModelInfer")(_request(), timeout=30)
    decoded = schema.message_class("inference.ModelInferResponse").FromString(answer)
    assert decoded.model_name == "plus_one"


def test_an_undecodable_stream_message_costs_only_itself(server):
    stream_response = schema.message_class("inference.ModelStreamInferResponse")
    sent = [
        _request(request_id="a"),
        GARBAGE,
        _request(request_id="b"),
        GARBAGE,
        _request(request_id="c"),
    ]
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.stream_stream(f"{SERVICE}/ModelStreamInfer")
        answers = [stream_response.FromString(raw) for raw in call(iter(sent), timeout=60)]
    assert len(answers) == len(sent)  # one answer each, and the call went on to the end
    served = sorted(a.infer_response.id for a in answers if not a.error_message)
    assert served == ["a", "b", "c"]
    errors = [a.error_message for a in answers if a.error_message]
    assert len(errors) == 2
    assert all("could not decode the ModelInferRequest message" in e for e in errors)


def test_an_error_echoing_a_huge_client_string_is_cut_to_fit(server):
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary(f"{SERVICE}/ModelInfer")
        with pytest.raises(grpc.RpcError) as caught:
            call(_request(model="m" * 200_000), timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    details = caught.value.details()
    assert details.startswith("Request for unknown model: 'mmm")
    assert len(details) < 5000 and details.endswith("more characters cut)")


def _pss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) >> 10
    raise AssertionError("no Pss in smaps_rollup")


def _big_request(model: str) -> bytes:
    request = schema.message_class("inference.ModelInferRequest")(model_name=model)
    request.inputs.add(name="INPUT", datatype="UINT8", shape=[BIG])
    request.raw_input_contents.append(b"\x01" * BIG)
    return request.SerializeToString()


def test_large_messages_leave_the_fronts_memory_where_it_was(server):
    options = [("grpc.max_send_message_length", 2**31 - 1)]
    with grpc.insecure_channel(server.grpc_address, options=options) as channel:
        call = channel.unary_unary(f"{SERVICE}/ModelInfer")
        call(_request(), timeout=30)  # warm
        before = _pss_mib(server.process.pid)
        answered = refused = 0
        for model in ("first_byte", "nope"):
            data = _big_request(model)
            for _ in range(4):
                try:
                    call(data, timeout=120)
                    answered += 1
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.NOT_FOUND
                    refused += 1
        assert (answered, refused) == (4, 4)
        # Quiet now: what the 8 large messages took comes back (the first_byte
        # instance's slot, a shared mapping of twice the input, stays).
        deadline = time.monotonic() + 30
        while (grown := _pss_mib(server.process.pid) - before) > 2 * BIG >> 20:
            assert time.monotonic() < deadline, f"the front kept {grown} MiB more"
            time.sleep(0.2)
