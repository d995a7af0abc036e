"""What a scheduler holds: requests waiting in its queue, batches running on instances,
what it needs of an instance (``Executor``), and what it tells one of a request."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Sequence
from typing import Protocol

import msgspec

from reposerve.backends.base import RequestFailure, RequestSlice
from reposerve.errors import ErrorKind, InstanceError, InvalidInput, ReposerveError
from reposerve.instance.outcomes import BatchTensor, OnEvent
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.clock import Timer
from reposerve.scheduler.lease import LeaseStream
from reposerve.scheduler.padding import Padding
from reposerve.tensor import Tensor, split_batch


class Executor(Protocol):
    """What the scheduler needs of an instance."""

    @property
    def in_flight(self) -> int: ...

    def has_capacity(self, staged: bool = False) -> bool:
        """Whether it takes a batch to run now, or (``staged``) to run next."""
        ...

    @property
    def per_request(self) -> bool:
        """Whether its backend reads each batch's request boundaries."""
        ...

    def run(
        self,
        inputs: Sequence[BatchTensor],
        on_event: OnEvent,
        requests: Sequence[RequestSlice] = (),
        call_depth: int = 0,
    ) -> int:
        """Start a batch, whose events (``BatchEvent``) go to ``on_event``; returns its
        id for ``cancel``. ``call_depth``: how deep in model calls its requests are (the
        deepest's)."""
        ...

    def cancel(self, batch_id: int) -> None:
        """Stop a decoupled batch whose clients have all gone."""
        ...

    def cancel_request(self, batch_id: int, index: int) -> None:
        """Tell the model that request ``index`` of a running batch has been cancelled."""
        ...


class Queued:
    __slots__ = (
        "request", "future", "key", "enqueued_ns", "timer", "sequence", "stream", "batch",
        "call_depth",
    )  # fmt: skip

    def __init__(
        self,
        request: InferRequest,
        future: asyncio.Future,
        key: tuple,
        now: int,
        stream: LeaseStream | None,
        call_depth: int = 0,
    ) -> None:
        self.request = request
        self.call_depth = call_depth  # 0: a client's request; n: made by n nested calls
        # Its lease, or (a streamed request) None once its last response went out.
        self.future = future
        self.key = key
        self.enqueued_ns = now
        self.timer: Timer | None = None
        self.sequence = -1  # delivery order under preserve_ordering, given when dispatched
        self.stream = stream  # where a decoupled model's responses go, a lease each
        self.batch: Batch | None = None  # the one running it


class Batch:
    """Requests handed to an instance together, and when that happened."""

    __slots__ = (
        "items", "started_ns", "launched_ns", "rerun", "waiting", "instance", "handle",
        "responded",
    )  # fmt: skip

    def __init__(self, items: list[Queued], started_ns: int, rerun: bool) -> None:
        self.items = items
        self.started_ns = started_ns
        self.launched_ns = started_ns  # set once the instance took it
        self.rerun = rerun  # part of a failed batch, run again to isolate the fault
        self.waiting = True  # staged on an instance, not running yet
        self.instance: Executor | None = None
        self.handle = -1  # the instance's id for it
        self.responded = False  # a decoupled batch sent a response: it must not run again


def request_error(failure: RequestFailure) -> ReposerveError:
    """The error of one request the model failed on its own, reported as its kind says,
    in the model's words alone (Triton hands a model's error to the client verbatim)."""
    message = failure.message
    if failure.kind is ErrorKind.INVALID_ARGUMENT:
        return InvalidInput(message)
    return InstanceError(message, failure.kind)


_parameters_encoder = msgspec.json.Encoder()
# Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START and _END, as request.flags() shows them
SEQUENCE_START = 1
SEQUENCE_END = 2


def gather(
    queues: Sequence[Iterable[Queued]], max_batch_size: int, padding: Padding | None
) -> tuple[list[Queued], bool]:
    """The requests that may leave with the oldest queued one (``queues``: one per
    priority level, highest first), and whether the batch cannot grow. Without padding
    they are the run of requests of its shapes; with padding, those of its key anywhere in
    its own level's queue (a look at no more than eight batches of it), the nearest
    lengths first (``Padding.closest``)."""
    if padding is None:
        return _run_of_shapes(itertools.chain.from_iterable(queues), max_batch_size)
    for queue in queues:
        head: list[Queued] = []
        for looked, item in enumerate(queue):
            if item.future.done() or (head and item.key != head[0].key):
                if looked >= 8 * max_batch_size:
                    break
                continue
            head.append(item)
            if padding.alone(item.key):
                return head, True  # past the largest bucket: it leaves at once, alone
            if len(head) > 2 * max_batch_size:  # room for those closest() leaves out
                break
        if head:
            sizes = [padding.sizes(item.request) for item in head]
            return [head[index] for index in padding.closest(sizes[0], sizes)], False
    return [], False


def _run_of_shapes(queued: Iterable[Queued], max_batch_size: int) -> tuple[list[Queued], bool]:
    head: list[Queued] = []
    total = 0
    for item in queued:
        if item.future.done():
            continue
        if head and item.key != head[0].key:
            return head, True  # a request of another shape follows: the batch cannot grow
        head.append(item)
        total += item.request.batch_size
        if total > max_batch_size:
            break
    return head, False


def request_outputs(
    outputs: dict[str, Tensor],
    requests: Sequence[InferRequest],
    batched: bool,
    padding: Padding | None,
) -> list[dict[str, Tensor]]:
    """Each request's part of a batch's ``outputs``, in batch order (with padding, cut
    back to its own length)."""
    if not batched:  # no batch dimension: the batch is one request, its outputs whole
        return [outputs]
    sizes = [request.batch_size for request in requests]
    pieces = {name: split_batch(tensor, sizes) for name, tensor in outputs.items()}
    parts = [{name: cut[index] for name, cut in pieces.items()} for index in range(len(sizes))]
    if padding is None:
        return parts
    return [padding.cut(request, part) for request, part in zip(requests, parts, strict=True)]


def batch_inputs(requests: Sequence[InferRequest], batched: bool) -> list[BatchTensor]:
    """A batch's inputs: each request's bytes in order, under one batch shape (``batched``:
    the model has a batch dimension; without one, the batch is a single request)."""
    first = requests[0]
    count = sum(request.batch_size for request in requests)
    return [
        BatchTensor(
            name,
            tensor.datatype,
            (count, *tensor.shape[1:]) if batched else tensor.shape,
            [request.inputs[name].raw for request in requests],
        )
        for name, tensor in first.inputs.items()
    ]


def request_slice(request: InferRequest) -> RequestSlice:
    """What a backend that answers per request is told of one request of its batch."""
    outputs = None if request.outputs is None else list(request.outputs)
    parameters = (
        _parameters_encoder.encode(request.parameters).decode() if request.parameters else "{}"
    )
    flags = SEQUENCE_START * request.sequence_start | SEQUENCE_END * request.sequence_end
    return RequestSlice(
        request.batch_size,
        request.id or "",
        outputs,
        parameters,
        request.timeout_us,
        request.sequence_id,
        flags,
    )
