"""The Triton python-backend shim, run in this process on a real model file: how a batch
becomes one InferenceRequest per client request, how the responses become the batch's
outputs, which problems fail one request and which fail the call; and pb_utils' helpers."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import numpy as np
import pytest

from reposerve.backends import ModelContext, create_backend, pb_utils
from reposerve.backends import pb_metrics as pb_utils_metrics
from reposerve.backends.base import RequestFailure, RequestResponse, RequestSlice
from reposerve.backends.drive import run_now
from reposerve.backends.triton_python import TritonResponseError, triton_args
from reposerve.config.load import parse_model_config
from reposerve.errors import ErrorKind

pytestmark = pytest.mark.unit

# The request id steers each answer, so one batch can hold every case.
MODEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                rid = request.request_id()
                if rid == "short":
                    return responses
                if rid == "refuse":
                    error = pb_utils.TritonError(f"refused {rid}", pb_utils.TritonError.NOT_FOUND)
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                rows = len(x)
                out0 = x + rows if rid != "wide" else np.zeros((rows, 7), np.float32)
                tensors = [pb_utils.Tensor("OUTPUT0", out0)]
                if rid != "missing":
                    tensors.append(pb_utils.Tensor("OUTPUT1", np.full_like(x, len(requests))))
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            return responses
"""

CONFIG = """
    max_batch_size = 8
    [[input]]
    name = "INPUT0"
    datatype = "FP32"
    shape = [-1]
    [[output]]
    name = "OUTPUT0"
    datatype = "FP32"
    shape = [-1]
    [[output]]
    name = "OUTPUT1"
    datatype = "FP32"
    shape = [-1]
    [[instance_group]]
    count = 2
    [[instance_group]]
    count = 1
"""


def _context(tmp_path: Path, instance_index: int = 0) -> ModelContext:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(textwrap.dedent(MODEL))
    return ModelContext(
        model_name="m",
        config=parse_model_config(textwrap.dedent(CONFIG), "m/config.toml"),
        version=1,
        version_path=version,
        device="cpu",
        instance_index=instance_index,
        threads=1,
    )


@pytest.fixture
def backend(tmp_path):
    return create_backend("python", _context(tmp_path))


def _batch(*ids_and_rows: tuple[str, int]) -> tuple[dict, list[RequestSlice]]:
    total = sum(rows for _, rows in ids_and_rows)
    inputs = {"INPUT0": np.arange(total * 2, dtype=np.float32).reshape(total, 2)}
    return inputs, [RequestSlice(rows, rid) for rid, rows in ids_and_rows]


def test_each_request_gets_its_own_rows_and_answers_with_its_own_outputs(backend):
    inputs, requests = _batch(("a", 1), ("b", 3), ("c", 2))
    answers = backend.execute_requests(inputs, requests)
    x = inputs["INPUT0"]
    assert [answer.index for answer in answers] == [0, 1, 2]
    assert all(answer.final and answer.failure is None for answer in answers)
    for answer, (start, rows) in zip(answers, [(0, 1), (1, 3), (4, 2)], strict=True):
        np.testing.assert_array_equal(answer.outputs["OUTPUT0"], x[start : start + rows] + rows)
        np.testing.assert_array_equal(answer.outputs["OUTPUT1"], np.full((rows, 2), 3, np.float32))


def test_an_error_response_fails_its_request_alone(backend):
    inputs, requests = _batch(("a", 1), ("refuse", 2), ("missing", 1))
    answers = backend.execute_requests(inputs, requests)
    assert [answer.failure for answer in answers] == [
        None,
        RequestFailure(1, "refused refuse", ErrorKind.NOT_FOUND),
        None,
    ]
    # Triton passes a response through as the model made it: an output left out is absent.
    assert list(answers[2].outputs) == ["OUTPUT0"]


def test_outputs_are_passed_through_in_the_shape_the_model_gave(backend):
    inputs, requests = _batch(("a", 1), ("wide", 1))
    answers = backend.execute_requests(inputs, requests)
    assert answers[0].outputs["OUTPUT0"].shape == (1, 2)
    assert answers[1].outputs["OUTPUT0"].shape == (1, 7)


def test_only_the_requested_outputs_are_kept_and_named_to_the_model(tmp_path):
    backend = create_backend("python", _context(tmp_path))
    inputs = {"INPUT0": np.ones((1, 2), np.float32)}
    [answer] = backend.execute_requests(inputs, [RequestSlice(1, "a", ["OUTPUT1"])])
    assert list(answer.outputs) == ["OUTPUT1"]


def test_a_response_list_of_the_wrong_length_fails_the_call(backend, tmp_path):
    inputs, requests = _batch(("a", 1), ("short", 1))
    with pytest.raises(TritonResponseError) as caught:
        backend.execute_requests(inputs, requests)
    assert caught.value.message == (
        f"{tmp_path}/m/1/model.py: TritonPythonModel.execute returned 1 responses for 2 "
        "request(s). Hint: return a list with one pb_utils.InferenceResponse per request, in "
        "the order of the requests"
    )


def test_initialize_args_name_the_instance_in_its_group(tmp_path):
    args = triton_args(_context(tmp_path, instance_index=2))
    assert args["model_instance_name"] == "m_1_0"
    assert triton_args(_context(tmp_path, instance_index=1))["model_instance_name"] == "m_0_1"
    assert args["model_repository"] == str(tmp_path / "m")
    assert (args["model_instance_kind"], args["model_instance_device_id"]) == ("CPU", "0")


def test_a_kind_model_instance_is_told_so(tmp_path):
    context = _context(tmp_path)
    config = parse_model_config(
        textwrap.dedent(CONFIG).replace("count = 1", 'count = 1\n    kind = "model"'), "m"
    )
    args = triton_args(msgspec.structs.replace(context, config=config, instance_index=2))
    assert args["model_instance_kind"] == "MODEL"


def test_pb_utils_helpers():
    config = {"output": [{"name": "OUT", "data_type": "TYPE_FP16", "dims": [3]}]}
    spec = pb_utils.get_output_config_by_name(config, "OUT")
    assert pb_utils.triton_string_to_numpy(spec["data_type"]) is np.float16
    assert pb_utils.get_input_config_by_name(config, "OUT") is None
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.dtype(object)) == 13
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    tensor = pb_utils.Tensor("T", np.zeros((2, 3), np.int64))
    assert (tensor.name(), tensor.shape(), tensor.triton_dtype()) == ("T", [2, 3], 9)
    response = pb_utils.InferenceResponse(output_tensors=[tensor])
    assert pb_utils.get_output_tensor_by_name(response, "T") is tensor
    assert not response.has_error()
    with pytest.raises(pb_utils.TritonModelException, match="use np.object_ arrays of bytes"):
        pb_utils.Tensor("S", np.array(["text"]))
    error = pb_utils.TritonError("gone", pb_utils.TritonError.UNAVAILABLE)
    assert (error.message(), error.code()) == ("gone", 4)


# Decoupled: each request answers twice through its sender, from a thread, then FINAL;
# request "fail" answers once and then sends an error.
DECOUPLED = """
    import threading

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                threading.Thread(target=self.answer, args=(request,)).start()

        def answer(self, request):
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().copy()
            for step in range(2):
                tensors = [pb_utils.Tensor("OUTPUT0", x + step), pb_utils.Tensor("OUTPUT1", x)]
                sender.send(pb_utils.InferenceResponse(output_tensors=tensors))
                if request.request_id() == "fail":
                    error = pb_utils.TritonError("no second", pb_utils.TritonError.INVALID_ARG)
                    sender.send(pb_utils.InferenceResponse(error=error), flags=1)
                    return
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


async def _collect(responses: AsyncIterator[object]) -> list[object]:
    """A decoupled batch's responses, taken as a sync instance takes them (``run_now``)."""
    return [response async for response in responses]


def test_a_decoupled_batch_answers_each_request_with_its_own_rows_until_its_final(tmp_path):
    context = _context(tmp_path)
    (context.version_path / "model.py").write_text(textwrap.dedent(DECOUPLED))
    context = msgspec.structs.replace(
        context, config=msgspec.structs.replace(context.config, decoupled=True)
    )
    backend = create_backend("python", context)
    assert backend.decoupled and not backend.is_async
    inputs = {"INPUT0": np.arange(6, dtype=np.float32).reshape(3, 2)}
    requests = [RequestSlice(2, "two"), RequestSlice(1, "fail")]
    answers = run_now(_collect(backend.execute_requests(inputs, requests)))
    by_request: dict[int, list] = {0: [], 1: []}
    for answer in answers:
        assert isinstance(answer, RequestResponse)
        by_request[answer.index].append(answer)
    first = by_request[0]
    assert [a.final for a in first] == [False, False, True] and first[2].outputs == {}
    assert [a.outputs["OUTPUT0"].tolist() for a in first[:2]] == [
        [[0, 1], [2, 3]],
        [[1, 2], [3, 4]],
    ]
    served, failed = by_request[1]
    assert served.outputs["OUTPUT0"].tolist() == [[4, 5]]
    assert failed.final and failed.failure == RequestFailure(
        1, "no second", ErrorKind.INVALID_ARGUMENT
    )


def test_a_response_sender_refuses_what_triton_refuses():
    sent = []
    sender = pb_utils.InferenceResponseSender(lambda *item: sent.append(item), lambda: False)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send()
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        sender.send(pb_utils.InferenceResponse(), flags=2)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="has been closed"):
        sender.send(pb_utils.InferenceResponse())
    assert sent == [(None, True)]
    request = pb_utils.InferenceRequest(inputs=[], requested_output_names=[], model_name="m")
    with pytest.raises(pb_utils.TritonModelException, match="not one it built"):
        request.get_response_sender()


def test_a_non_decoupled_sender_takes_one_response_then_its_final():
    sent = []
    sender = pb_utils.InferenceResponseSender(lambda *item: sent.append(item), lambda: False, False)
    with pytest.raises(pb_utils.TritonModelException) as caught:
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert str(caught.value) == (
        "Unable to send response. Non-decoupled model cannot send complete final before "
        "sending a response."
    )
    response = pb_utils.InferenceResponse()
    sender.send(response)
    with pytest.raises(pb_utils.TritonModelException) as caught:
        sender.send(response)
    assert str(caught.value) == (
        "Unable to send response. Non-decoupled model cannot send more than one response."
    )
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == [(response, False), (None, True)]


SENDER_MODEL = """
    import threading

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            def answer(request):
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                sender = request.get_response_sender()
                sender.send(
                    pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )

            threads = [threading.Thread(target=answer, args=(r,)) for r in requests]
            for thread in threads:
                thread.start()
            return None
"""


def test_a_non_decoupled_model_may_answer_through_its_senders(tmp_path):
    context = _context(tmp_path)
    (context.version_path / "model.py").write_text(textwrap.dedent(SENDER_MODEL))
    backend = create_backend("python", context)
    inputs, requests = _batch(("a", 1), ("b", 2))
    answers = backend.execute_requests(inputs, requests)
    np.testing.assert_array_equal(answers[1].outputs["OUTPUT0"], inputs["INPUT0"][1:] * 2)
    assert [answer.index for answer in answers] == [0, 1]


def test_request_and_response_parameters_are_json_text():
    request = pb_utils.InferenceRequest._received([], "", [], '{"k": 1}', None, lambda: False)
    assert request.parameters() == '{"k": 1}'
    response = pb_utils.InferenceResponse([], parameters={"a": True, "b": 2, "c": "x"})
    assert response.parameters() == '{"a":true,"b":2,"c":"x"}'
    assert pb_utils.InferenceResponse([]).parameters() == "{}"
    with pytest.raises(pb_utils.TritonModelException) as caught:
        pb_utils.InferenceResponse([], parameters={"f": 0.5})
    assert str(caught.value) == (
        "Expect parameters values to have type bool/int/str, found type <class 'float'>"
    )
    with pytest.raises(pb_utils.TritonModelException) as caught:
        pb_utils.InferenceResponse([], parameters={1: "int key"})
    assert str(caught.value) == "Expect parameters keys to have type str, found type <class 'int'>"
    with pytest.raises(pb_utils.TritonModelException, match=", got <class 'list'>"):
        pb_utils.InferenceResponse([], parameters=[])


def test_arguments_are_checked_as_triton_checks_them():
    tensor = pb_utils.Tensor("INPUT0", np.asarray([1, 2], np.int32))
    build = {"inputs": [tensor], "model_name": "m", "requested_output_names": ["o"]}
    for bad, error in [
        ({"inputs": [None]}, pb_utils.TritonModelException),
        ({"inputs": None}, TypeError),
        ({"model_name": None}, TypeError),
        ({"requested_output_names": [None]}, TypeError),
        ({"requested_output_names": None}, TypeError),
        ({"correlation_id": None}, TypeError),
        ({"request_id": None}, TypeError),
        ({"model_version": None}, TypeError),
        ({"flags": None}, TypeError),
    ]:
        with pytest.raises(error):
            pb_utils.InferenceRequest(**{**build, **bad})
    assert pb_utils.InferenceRequest(**build, correlation_id="s-5").correlation_id() == "s-5"
    assert pb_utils.InferenceRequest(**build, correlation_id=5).correlation_id() == 5
    # A BLS model name read from a BYTES input is bytes: Triton's example passes it as is.
    assert pb_utils.InferenceRequest(**{**build, "model_name": b"add"}).model_name() == "add"
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[None])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)
    for name, array in [(None, tensor.as_numpy()), ("OUTPUT0", None), ("", None)]:
        with pytest.raises(TypeError):
            pb_utils.Tensor(name, array)
    for name in ("OUTPUT0", ""):
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.Tensor.from_dlpack(name, None)
    for level in (None, 1):
        with pytest.raises(TypeError):
            pb_utils.Logger.log("message", level)
    for log in (pb_utils.Logger.log_info, pb_utils.Logger.log_warn, pb_utils.Logger.log_error):
        with pytest.raises(TypeError):
            log(None)
    pb_utils.Logger.log("level unspecified")


def test_a_bf16_tensor_goes_through_dlpack_not_numpy():
    torch = pytest.importorskip("torch")
    bits = torch.tensor([1.5, -2.0], dtype=torch.bfloat16).view(torch.int16).numpy()
    tensor = pb_utils.Tensor._of_bf16("INPUT0", bits.view(np.uint16))
    with pytest.raises(pb_utils.TritonModelException, match="BF16 and cannot be converted"):
        tensor.as_numpy()
    assert tensor.triton_dtype() == 14
    as_torch = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert as_torch.dtype == torch.bfloat16 and as_torch.tolist() == [1.5, -2.0]
    back = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(as_torch * 2))
    assert back.triton_dtype() == 14
    assert back._array.tolist() == (as_torch * 2).view(torch.int16).numpy().view(np.uint16).tolist()


def test_auto_complete_model_config_edits_as_triton_allows():
    config = pb_utils.ModelConfig(
        {
            "name": "m",
            "max_batch_size": 0,
            "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [],
        }
    )
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})  # agrees: kept
    config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]})
    config.set_model_transaction_policy({"decoupled": True})
    document = config.as_dict()
    assert [t["name"] for t in document["input"]] == ["IN"]
    assert document["output"] == [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}]
    assert document["model_transaction_policy"] == {"decoupled": True}
    failures = [
        (
            lambda: config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [5]}),
            "model 'm', tensor 'IN': the model expects dims [5] but the model configuration "
            "specifies dims [4]",
        ),
        (
            lambda: config.add_input({"name": "IN", "data_type": "TYPE_INT8", "dims": [4]}),
            "unable to load model 'm', configuration expects datatype TYPE_FP32 for input "
            "'IN', model provides TYPE_INT8",
        ),
        (
            lambda: config.add_output({"name": "X", "dims": [1]}),
            "output 'X' in auto-complete-config function for model 'm' is missing "
            "'data_type' property.",
        ),
        (
            lambda: config.add_output({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "o": 1}),
            "output 'X' in auto-complete-config function for model 'm' contains property "
            "other than 'name', 'data_type' and 'dims'.",
        ),
        (
            lambda: config.set_model_transaction_policy({"decoupled": False}),
            "trying to change decoupled property in auto-complete-config for model 'm', which "
            "is already set to 'True'.",
        ),
    ]
    for edit, message in failures:
        with pytest.raises(ValueError) as caught:
            edit()
        assert str(caught.value) == message


def test_custom_metrics_follow_tritons_rules():
    sent = []
    pb_utils_metrics.connect(sent.append)
    try:
        family = pb_utils.MetricFamily("rules_counter", "counted", pb_utils.MetricFamily.COUNTER)
        same = pb_utils.MetricFamily("rules_counter", "other words", pb_utils.MetricFamily.COUNTER)
        first, second = family.Metric({"k": "v"}), same.Metric({"k": "v"})
        first.increment(2.5)
        assert second.value() == 2.5  # one family by name, one metric by labels
        for refused in (
            lambda: first.increment(-1),
            lambda: first.set(3),
            lambda: first.observe(1),
        ):
            with pytest.raises(pb_utils.TritonModelException):
                refused()
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.MetricFamily("rules_counter", "d", pb_utils.MetricFamily.GAUGE)
        del family, same
        with pytest.raises(pb_utils.TritonModelException) as caught:
            first.value()
        assert str(caught.value) == (
            "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
        )
        histogram = pb_utils.MetricFamily("rules_h", "h", pb_utils.MetricFamily.HISTOGRAM)
        for buckets in (None, [2.5, 0.1], [1, 1, 2]):
            with pytest.raises(pb_utils.TritonModelException):
                histogram.Metric(labels={}, buckets=buckets)
        observed = histogram.Metric(buckets=[1.0, 5.0])
        for value in (0.5, 1.0, 3.0, 9.0):
            observed.observe(value)
        last = sent[-1]
        assert (last.family, last.bucket_counts, last.count, last.value) == (
            "rules_h",
            [2, 1],
            4,
            13.5,
        )
    finally:
        pb_utils_metrics.connect(None)


FIRST_WINS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            first = requests[0]
            x = first.inputs()[0].as_numpy()
            sent = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 100)])
            first.get_response_sender().send(sent)
            if first.request_id() == "raise":
                raise RuntimeError("after the first answer")
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests
            ]
"""


def test_a_response_sent_before_execute_returns_is_that_requests_answer(tmp_path):
    context = _context(tmp_path)
    (context.version_path / "model.py").write_text(textwrap.dedent(FIRST_WINS))
    backend = create_backend("python", context)
    inputs, requests = _batch(("a", 1), ("b", 1))
    first, second = backend.execute_requests(inputs, requests)
    np.testing.assert_array_equal(first.outputs["OUTPUT0"], inputs["INPUT0"][:1] + 100)
    np.testing.assert_array_equal(second.outputs["OUTPUT0"], inputs["INPUT0"][1:])
    # execute failing after it answered a request: that answer stands, the rest fail.
    inputs, requests = _batch(("raise", 1), ("b", 1))
    first, second = backend.execute_requests(inputs, requests)
    assert first.failure is None
    assert second.failure == RequestFailure(
        1, "RuntimeError: after the first answer", ErrorKind.INTERNAL
    )
