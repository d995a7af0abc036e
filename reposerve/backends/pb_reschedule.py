"""Request rescheduling for python models (Triton's ``set_release_flags(
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``): a request the model hands back runs through
``execute`` again, with the others it handed back, until the model releases it.

reposerve runs the next round at once on the same instance, in the same batch: what
Triton's sequence batcher would do for an iterative model with no other request ready,
and all a model may rely on (its request comes back, on its instance, in order).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from reposerve.backends import pb_utils

Execute = Callable[[list[pb_utils.InferenceRequest]], Any]


def run_until_released(execute: Execute, requests: Sequence[pb_utils.InferenceRequest]) -> Any:
    """``execute(requests)``, then again for the ones it rescheduled, each round's
    responses taking the rescheduled requests' places."""
    returned = execute(list(requests))
    again = _rescheduled(requests, range(len(requests)), returned)
    while again:
        returned = _merged(returned, again, execute([requests[i] for i in again]))
        again = _rescheduled(requests, again, returned)
    return returned


async def run_until_released_async(
    execute: Callable[[list[pb_utils.InferenceRequest]], Awaitable[Any]],
    requests: Sequence[pb_utils.InferenceRequest],
) -> Any:
    """``run_until_released`` for an ``async def execute``."""
    returned = await execute(list(requests))
    again = _rescheduled(requests, range(len(requests)), returned)
    while again:
        returned = _merged(returned, again, await execute([requests[i] for i in again]))
        again = _rescheduled(requests, again, returned)
    return returned


def _rescheduled(
    requests: Sequence[pb_utils.InferenceRequest], among: Sequence[int], returned: Any
) -> list[int]:
    """The requests of ``among`` to run again. One that execute both rescheduled and
    answered in its returned list is not: its place gets Triton's error instead (in the
    list, which is the caller's to mutate once execute has returned it)."""
    again = []
    for index in among:
        if not requests[index]._take_reschedule():
            continue
        if isinstance(returned, list) and index < len(returned) and returned[index] is not None:
            returned[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(_NOT_NONE))
            continue
        again.append(index)
    return again


# Triton's words (and spelling), which its tests look for
_NOT_NONE = "Expected a None object in the execute function return list for reschduled request"


def _merged(returned: Any, again: list[int], more: Any) -> Any:
    """The responses of a whole batch after a round of its rescheduled requests: a list
    with theirs in their places; None when the model answers through its senders."""
    if not isinstance(returned, list | tuple) or not isinstance(more, list | tuple):
        return more if returned is None or more is None else returned
    if len(more) != len(again):
        return more  # the count check reports it, naming what execute returned
    merged = list(returned)
    for index, response in zip(again, more, strict=True):
        merged[index] = response
    return merged
