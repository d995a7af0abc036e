"""Cutting a batch's outcome into each request's share, as pure logic: rows by batch size,
a backend's own answers, failures alone, padded outputs cut back, and a decoupled
model's responses for all requests or one."""

from __future__ import annotations

import numpy as np
import pytest

from reposerve.backends.base import RequestFailure
from reposerve.config import parse_model_config
from reposerve.errors import ErrorKind
from reposerve.instance.outcomes import BatchOutcome, RequestOutputs, SlotHold, StreamedResponse
from reposerve.scheduler.cutting import response_shares, shares
from reposerve.scheduler.padding import Padding
from reposerve.tensor import Tensor
from tests.scheduler_fakes import make_request

pytestmark = pytest.mark.unit


def _tensor(array: np.ndarray) -> Tensor:
    return Tensor("FP32", array.shape, memoryview(np.ascontiguousarray(array)).cast("B"))


def _rows(tensor: Tensor) -> list:
    return np.frombuffer(tensor.raw, np.float32).reshape(tensor.shape).tolist()


def _outcome(outputs: np.ndarray, **more) -> BatchOutcome:
    return BatchOutcome({"Y": _tensor(outputs)}, 0, SlotHold(lambda: None), **more)


REQUESTS = [make_request([[1, 1]]), make_request([[2, 2], [3, 3]]), make_request([[4, 4]])]
BATCH = np.array([[1, 1], [2, 2], [3, 3], [4, 4]], np.float32) * 10


def test_each_request_gets_its_rows_in_batch_order():
    cut = shares(REQUESTS, _outcome(BATCH), batched=True, padding=None)
    assert [_rows(share.outputs["Y"]) for share in cut] == [
        [[10, 10]],
        [[20, 20], [30, 30]],
        [[40, 40]],
    ]
    assert all(share.parameters == {} for share in cut)


def test_a_request_the_model_failed_alone_gets_its_failure_and_the_rest_their_rows():
    failure = RequestFailure(1, "bad row", ErrorKind.INVALID_ARGUMENT)
    cut = shares(REQUESTS, _outcome(BATCH, failed=[failure]), batched=True, padding=None)
    assert cut[1] is failure
    assert _rows(cut[0].outputs["Y"]) == [[10, 10]] and _rows(cut[2].outputs["Y"]) == [[40, 40]]


def test_a_backends_own_answer_is_its_requests_share_with_its_parameters():
    own = RequestOutputs({"Y": _tensor(np.array([[7, 7]], np.float32))}, {"note": "mine"})
    cut = shares(REQUESTS, _outcome(BATCH, answers={2: own}), batched=True, padding=None)
    assert cut[2] is own
    assert _rows(cut[0].outputs["Y"]) == [[10, 10]]


def test_without_a_batch_dimension_the_one_request_gets_the_outputs_whole():
    whole = np.array([5, 6], np.float32)
    (share,) = shares([make_request([5, 6])], _outcome(whole), batched=False, padding=None)
    assert _rows(share.outputs["Y"]) == [5, 6]


PADDED = parse_model_config(
    """
    max_batch_size = 4
    [[input]]
    name = "X"
    datatype = "FP32"
    shape = [-1]
    [[output]]
    name = "Y"
    datatype = "FP32"
    shape = [-1]
    [dynamic_batching]
    pad = { X = 0 }
    unpad = { Y = "X" }
    """,
    "m/config.toml",
)


def test_padded_outputs_are_cut_back_to_each_requests_length_answers_too():
    short, long = make_request([[1, 1]]), make_request([[2, 2, 2]])
    padded = np.array([[1, 1, 0], [2, 2, 2]], np.float32)
    padding = Padding(PADDED)
    cut = shares([short, long], _outcome(padded), batched=True, padding=padding)
    assert [_rows(share.outputs["Y"]) for share in cut] == [[[1, 1]], [[2, 2, 2]]]
    own = RequestOutputs({"Y": _tensor(np.array([[9, 9, 9]], np.float32))}, {"k": 1})
    cut = shares([short, long], _outcome(padded, answers={0: own}), True, padding)
    assert _rows(cut[0].outputs["Y"]) == [[9, 9]] and cut[0].parameters == {"k": 1}


def test_a_response_goes_to_every_request_by_its_rows_or_whole_to_the_one_it_names():
    response = StreamedResponse({"Y": _tensor(BATCH)})
    parts = response_shares(REQUESTS, response, batched=True, padding=None)
    assert [(index, _rows(outputs["Y"])) for index, outputs in parts] == [
        (0, [[10, 10]]),
        (1, [[20, 20], [30, 30]]),
        (2, [[40, 40]]),
    ]
    one = StreamedResponse({"Y": _tensor(np.array([[8, 8]], np.float32))}, request=2)
    ((index, outputs),) = response_shares(REQUESTS, one, batched=True, padding=None)
    assert index == 2 and _rows(outputs["Y"]) == [[8, 8]]
