"""Frames between a front process and the core (the process that owns the repository,
the schedulers and the instances), on one Unix socket per front (``reposerve.framing``).

Frames carry no tensor data: a request's bytes lie in a slot of the front's (a sealed
memfd, ``reposerve.instance.arena``) that the core maps by ``/proc/PID/fd/N``; the core
writes a request's answers into the same slot, after the request. Every call the front
opens ends with exactly one frame that says it is over (``last``): an ``Answered`` with
``last``, a ``Failed`` or an ``Ended``; until then the slot is the call's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from reposerve.operations import AnyOperation


class OutputRef(msgspec.Struct, array_like=True, frozen=True):
    """One output of an answer, in wire layout at ``offset`` of the call's slot."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    binary: bool

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


# front -> core
class SlotOpened(msgspec.Struct, tag=True, array_like=True):
    """The front made slot ``slot``: its memfd is the front's descriptor ``fd``."""

    slot: int
    fd: int
    size: int


class Infer(msgspec.Struct, tag=True, array_like=True):
    """A V2 HTTP request: its body (``nbytes``, at the slot's start), answered once."""

    call: int
    model: str
    version: str | None
    slot: int
    slot_size: int
    nbytes: int
    header_length: int | None


class InferParts(msgspec.Struct, tag=True, array_like=True):
    """A request whose tensors travel apart from its header (gRPC): ``header`` is the V2
    header (msgpack), each input's bytes at ``spans[i]`` = (offset, nbytes) of the slot.
    ``stream``: answered as a stream (ModelStreamInfer)."""

    call: int
    model: str
    version: str | None
    header: bytes
    slot: int
    slot_size: int
    spans: list[tuple[int, int]]
    stream: bool


class Generate(msgspec.Struct, tag=True, array_like=True):
    """Triton's generate extension: its JSON body (``nbytes``) at the slot's start."""

    call: int
    model: str
    version: str | None
    slot: int
    slot_size: int
    nbytes: int


class Cancel(msgspec.Struct, tag=True, array_like=True):
    """The client left: stop the call (its last frame still comes)."""

    call: int


class Taken(msgspec.Struct, tag=True, array_like=True):
    """A streamed answer was encoded: the slot space it took may be written again."""

    call: int


class Operate(msgspec.Struct, tag=True, array_like=True):
    """One of the service's other operations, the value itself (``reposerve.operations``),
    answered by a ``Returned``."""

    call: int
    operation: AnyOperation


# core -> front
class Started(msgspec.Struct, tag=True, array_like=True):
    """A stream's request was decoded and accepted: its answers follow."""

    call: int


class Answered(msgspec.Struct, tag=True, array_like=True):
    call: int
    version: str
    request_id: str | None
    outputs: list[OutputRef]
    parameters: dict[str, Any]
    final: bool  # the request's last response (Answer.final)
    slot_size: int  # the slot's size now (the core may have grown it)
    last: bool  # no more frames for this call
    # Outputs written into client shared memory (no bytes in the slot), by name
    # (Answer.shared_outputs).
    shared_outputs: frozenset[str] = frozenset()


class Failed(msgspec.Struct, tag=True, array_like=True):
    call: int
    message: str
    kind: str  # an ErrorKind's value
    # The error's class in reposerve.errors: a front tells a model's failure from a
    # refused request by it (a stream's error event, not an error reply).
    error: str = "ReposerveError"


class Ended(msgspec.Struct, tag=True, array_like=True):
    """A stream ended after its last answer (which said ``final``, or none did)."""

    call: int


class Returned(msgspec.Struct, tag=True, array_like=True):
    call: int
    value: bytes  # the operation's result, msgpack (``result_type`` says what it decodes as)


class Leave(msgspec.Struct, tag=True, array_like=True):
    """The server shuts down: stop accepting, finish what was accepted, exit."""


FromFront = SlotOpened | Infer | InferParts | Generate | Cancel | Taken | Operate
ToFront = Started | Answered | Failed | Ended | Returned | Leave
