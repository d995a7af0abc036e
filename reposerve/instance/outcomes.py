"""What goes into an instance's batch and what comes out: its tensors, the events its
owner receives as values (started, a decoupled batch's responses, its outcome: the
outputs, or a failure and its cause), and the hold that keeps a batch's slot while its
outputs are read."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from reposerve.backends.base import RequestFailure
from reposerve.instance.messages import TensorRef
from reposerve.tensor import FileWindow, Tensor


class RequestOutputs(msgspec.Struct, frozen=True):
    """One request's own outputs (views on the slot) and its response's parameters."""

    outputs: dict[str, Tensor]
    parameters: dict[str, Any] = {}


class SlotHold:
    """Shares in a slot's contents: ``on_free`` runs once the last share is released. The
    one who makes it holds the first share; each reader takes another (``share``) and
    releases it when done, so the slot is written again only after every reader."""

    __slots__ = ("_shares", "_on_free")

    def __init__(self, on_free: Callable[[], None]) -> None:
        self._shares = 1
        self._on_free = on_free

    def share(self) -> SlotHold:
        self._shares += 1
        return self

    def release(self) -> None:
        self._shares -= 1
        if self._shares == 0:
            self._on_free()


class BatchOutcome(msgspec.Struct):
    """A finished batch: outputs are views on the slot, valid while it is received and, for
    whoever takes a share of ``slot``, until that share is released: the batch's (cut
    into its requests by the scheduler), or each request's own (``answers``, by its index
    in the batch, from a backend that answers per request). ``failed`` names requests
    that failed on their own."""

    outputs: dict[str, Tensor]
    compute_ns: int
    slot: SlotHold
    failed: list[RequestFailure] = []
    answers: dict[int, RequestOutputs] = {}


class BatchTensor(msgspec.Struct, frozen=True):
    """One input of a batch: its batch shape, and each request's wire bytes in batch order."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    parts: Sequence[bytes | memoryview | FileWindow]


class PartUnreadable(OSError):
    """One request's part of a batch could not be read (its client cut its shared-memory
    file short): that request fails, and the batch goes on without it."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index  # the request's place in the batch
        self.message = message


class FailureCause(enum.Enum):
    MODEL = "model"  # execute raised, or returned outputs that break the config
    INVALID_INPUT = "invalid_input"  # execute raised reposerve.InvalidInput
    INSTANCE = "instance"  # the process died, was killed, or overran the timeout
    STOPPED = "stopped"  # its owner stopped it on purpose (unload, shutdown) before it ended
    NOT_STARTED = "not_started"  # staged behind a batch that took the process down: it
    # never ran, and may run elsewhere


class BatchFailure(msgspec.Struct, frozen=True):
    """A batch that produced no outputs, and why."""

    message: str
    cause: FailureCause
    verbatim: bool = False  # the message says it all (Triton's words): sent as it is

    @property
    def raised(self) -> bool:
        """Whether execute itself failed (and may succeed for part of the batch)."""
        return self.cause in (FailureCause.MODEL, FailureCause.INVALID_INPUT)


class BatchStarted(msgspec.Struct, frozen=True):
    """The batch began to run: as it was sent, or once the batch ahead of it on its
    process ended (it waited staged until then)."""


STARTED = BatchStarted()


def _resumed() -> None:
    """What a response made here resumes: nothing (no instance waits for it)."""


class StreamedResponse(msgspec.Struct):
    """One response of a decoupled batch: outputs are views on the slot, valid until the
    instance goes on, which it does once ``resume`` is called.
    ``request``: the one request it answers (its rows), -1 for all; ``final``: that
    request's last; ``failure``: that request failed."""

    outputs: dict[str, Tensor]
    request: int = -1
    final: bool = False
    failure: RequestFailure | None = None
    parameters: dict[str, Any] = {}
    resume: Callable[[], None] = _resumed


BatchEvent = BatchStarted | StreamedResponse | BatchOutcome | BatchFailure
"""What an instance tells the owner of a batch, in order: that it started, a decoupled
model's responses, then its outcome (outputs or a failure), the last."""

OnEvent = Callable[[BatchEvent], None]


def outcome_to(receive: Callable[[BatchOutcome | BatchFailure], object]) -> OnEvent:
    """An ``on_event`` for an owner that wants a batch's outcome alone (a warmup): its
    start is not told, a decoupled model's responses are read and dropped."""

    def on_event(event: BatchEvent) -> None:
        match event:
            case StreamedResponse():
                event.resume()
            case BatchOutcome() | BatchFailure():
                receive(event)

    return on_event


def views(view: memoryview, refs: list[TensorRef]) -> dict[str, Tensor]:
    """The tensors ``refs`` place in a slot, as views on it."""
    return {
        ref.name: Tensor(ref.datatype, ref.shape, view[ref.offset : ref.offset + ref.nbytes])
        for ref in refs
    }


_parameters_decoder = msgspec.json.Decoder(dict[str, Any])


def response_parameters(text: str) -> dict[str, Any]:
    """A response's parameters (the instance checked them: a JSON object)."""
    return {} if text == "{}" else _parameters_decoder.decode(text)
