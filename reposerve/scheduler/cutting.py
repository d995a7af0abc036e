"""Cutting what an instance answered into each request's share: pure, no slot, no clock.

A batch's outputs hold its requests' rows in batch order; a backend that answers per
request gives each its own outputs instead; the model may fail some requests alone. The
scheduler wraps each share in a lease on the slot (``reposerve.scheduler.lease``).
"""

from __future__ import annotations

from collections.abc import Sequence

from reposerve.backends.base import RequestFailure
from reposerve.instance.outcomes import BatchOutcome, RequestOutputs, StreamedResponse
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.padding import Padding
from reposerve.scheduler.work import request_outputs
from reposerve.tensor import Tensor


def shares(
    requests: Sequence[InferRequest],
    outcome: BatchOutcome,
    batched: bool,
    padding: Padding | None,
) -> list[RequestOutputs | RequestFailure]:
    """Each request's share of a finished batch, in batch order: its failure, when the
    model failed it alone; its own answer, from a backend that answers per request (cut
    back to its length under padding); else its rows of the batch's outputs."""
    failed = {failure.index: failure for failure in outcome.failed}
    pieces = request_outputs(outcome.outputs, requests, batched, padding)
    result: list[RequestOutputs | RequestFailure] = []
    for index, request in enumerate(requests):
        failure = failed.get(index)
        if failure is not None:
            result.append(failure)
            continue
        answer = outcome.answers.get(index)
        if answer is None:
            result.append(RequestOutputs(pieces[index]))
        elif padding is None:
            result.append(answer)
        else:
            result.append(RequestOutputs(padding.cut(request, answer.outputs), answer.parameters))
    return result


def response_shares(
    requests: Sequence[InferRequest],
    response: StreamedResponse,
    batched: bool,
    padding: Padding | None,
) -> list[tuple[int, dict[str, Tensor]]]:
    """A decoupled batch's response cut by request, as (index in the batch, outputs):
    every request's rows, or the whole response for the one request it names."""
    if response.request < 0:
        return list(enumerate(request_outputs(response.outputs, requests, batched, padding)))
    outputs = response.outputs
    if padding is not None:
        outputs = padding.cut(requests[response.request], outputs)
    return [(response.request, outputs)]
