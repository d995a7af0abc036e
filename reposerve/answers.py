"""What a request gets back: ``Answer``, its outputs as the request asked for them (selected,
classified, placed in client shared memory), valid until released; and how a front turns
a stream of them into messages (``encoded``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from reposerve.protocol.classification import classify
from reposerve.protocol.request import InferRequest
from reposerve.repository import ModelVersion
from reposerve.scheduler.lease import Lease
from reposerve.shared_memory import Claims
from reposerve.tensor import Tensor

T = TypeVar("T")


def selected_outputs(request: InferRequest, declared: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(output, binary) in response order: the requested ones, or every declared output."""
    if request.outputs is None:
        return [(output, request.binary_output) for output in declared]
    return [
        (output, request.binary_output if binary is None else binary)
        for output, binary in request.outputs.items()
    ]


class Releasable(Protocol):
    """What keeps an answer's outputs valid until released: a scheduler's ``Lease``, or a
    front process's claim on the slot its answer was copied into."""

    def release(self) -> None: ...


class Answer:
    """One response to a request, as it asked: ``outputs`` as (output, tensor, binary) in
    response order, views on the batch's shared memory until ``release`` (or the end of
    a ``with`` block), and the response's parameters. ``final``: the request's last
    response (a model that answers once; a decoupled one's that the model sent with the
    final flag: one that sends the flag alone ends its stream with no answer).
    ``shared_outputs``: the names of the outputs written into client shared memory (their
    tensors in ``outputs`` hold no bytes)."""

    __slots__ = (
        "outputs", "parameters", "final", "version", "request_id", "shared_outputs", "_lease",
    )  # fmt: skip

    def __init__(
        self,
        outputs: list[tuple[str, Tensor, bool]],
        parameters: dict[str, Any],
        final: bool,
        version: str,
        request_id: str | None,
        lease: Releasable,
        shared_outputs: frozenset[str] = frozenset(),
    ) -> None:
        self.outputs = outputs
        self.parameters = parameters
        self.final = final
        self.version = version  # the model version that answered, as text
        self.request_id = request_id
        self.shared_outputs = shared_outputs
        self._lease = lease

    @property
    def tensors(self) -> list[tuple[str, Tensor]]:
        return [(output, tensor) for output, tensor, _ in self.outputs]

    def release(self) -> None:
        self._lease.release()

    def __enter__(self) -> Answer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._lease.release()


class Answers(Protocol):
    """A stream of answers that its reader may close before its end (the client left), which
    stops the generation: ``InferenceService``'s async generator, or a front worker's
    ``reposerve.fronts.remote._Answers``."""

    def __aiter__(self) -> AsyncIterator[Answer]: ...

    def __anext__(self) -> Awaitable[Answer]: ...

    def aclose(self) -> Awaitable[object]: ...


async def encoded(answers: Answers, encode: Callable[[Answer], T]) -> AsyncGenerator[T, None]:
    """Each answer as ``encode`` makes it, released as soon as it is encoded. Closing this
    closes ``answers`` (which stops a generation the client no longer wants)."""
    async with contextlib.aclosing(answers):
        async for answer in answers:
            with answer:
                message = encode(answer)
            yield message


class _Both:
    """An answer's lease and its request's claims on client shared memory, let go as one."""

    __slots__ = ("_lease", "_claims")

    def __init__(self, lease: Lease, claims: Claims) -> None:
        self._lease = lease
        self._claims = claims

    def release(self) -> None:
        self._lease.release()
        self._claims.release()


def make_answer(
    model: ModelVersion,
    request: InferRequest,
    selected: list[tuple[str, bool]],
    lease: Lease,
    final: bool,
    claims: Claims,
    hold: bool = False,
) -> Answer:
    """The answer ``lease`` makes: its outputs selected and classified as the request
    asks, those it placed in client shared memory written there. A requested output the
    model left out of its answer (a Triton model may) is left out of the response, as
    Triton does. ``hold``: the answer lets go of ``claims`` too."""
    try:
        outputs = lease.outputs
        classes = request.classifications
        if classes:
            batched = model.config.max_batch_size > 0
            outputs = {
                output: classify(tensor, classes[output], batched, model.labels.get(output, ()))
                if output in classes
                else tensor
                for output, tensor in outputs.items()
            }
        chosen = [
            (output, outputs[output], binary) for output, binary in selected if output in outputs
        ]
        shared: frozenset[str] = frozenset()
        if request.output_regions:
            shared = claims.place(chosen, request.output_regions, model.name)
    except BaseException:
        lease.release()
        raise
    keeper = _Both(lease, claims) if hold and claims.held else lease
    return Answer(chosen, lease.parameters, final, model.version_text, request.id, keeper, shared)
