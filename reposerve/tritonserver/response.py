"""``InferenceResponse`` and the iterators ``Model.infer`` and ``Model.async_infer``
return. A request is sent when it is made; its responses arrive on the server's thread
and are queued for the iterator (and the caller's ``response_queue``, if given) whether or
not anyone iterates yet. As Triton's, the last response has ``final`` set: a decoupled
model's stream ends with an empty final response, and an error ends a request in a
response that carries it (raised by the iterator with ``raise_on_error``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from reposerve.embedded.tensors import InferResult
from reposerve.tritonserver.errors import TritonError, triton_error
from reposerve.tritonserver.tensor import Tensor

if TYPE_CHECKING:
    from reposerve.tritonserver.model import Model


@dataclass
class InferenceResponse:
    model: Model
    request_id: str | None = None
    parameters: dict[str, str | int | bool] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: TritonError | None = None
    classification_label: str | None = None
    final: bool = False


class Responses:
    """A request's responses as they come (on the server's thread): each made into an
    ``InferenceResponse`` and handed to ``put`` (the iterator's queue, and the caller's)."""

    def __init__(self, model: Model, put: Callable[[InferenceResponse], None]) -> None:
        self.model = model
        self.put = put
        self.ended = False  # a final response was put

    def deliver(self, item: InferResult | Exception | None) -> None:
        if self.ended:
            return
        match item:
            case InferResult():
                response = InferenceResponse(
                    self.model,
                    item.id,
                    item.parameters,
                    {name: _tensor(array) for name, array in item.outputs.items()},
                    final=item.final,
                )
            case Exception():
                response = InferenceResponse(self.model, error=triton_error(item), final=True)
            case None:
                response = InferenceResponse(self.model, final=True)
        self.ended = response.final
        self.put(response)


def _tensor(array: np.ndarray) -> Tensor:
    """An output array as a Tensor (the array is the response's own)."""
    if array.dtype == object:
        return Tensor.from_bytes_array(array)
    return Tensor.from_dlpack(array)


class _Iteration:
    """What both iterators share: the request sent, and the end of its responses."""

    def __init__(self, sent: concurrent.futures.Future[None], raise_on_error: bool) -> None:
        self._sent = sent
        self._raise_on_error = raise_on_error
        self._complete = False

    def _taken(self, response: InferenceResponse) -> InferenceResponse:
        self._complete = response.final
        if response.error is not None and self._raise_on_error:
            raise response.error
        return response

    def cancel(self) -> None:
        """Cancel the request (its last response then carries the error saying so)."""
        self._sent.cancel()


class ResponseIterator(_Iteration):
    """A request's responses, for a ``for`` loop."""

    def __init__(
        self,
        responses: queue.SimpleQueue[InferenceResponse],
        sent: concurrent.futures.Future[None],
        raise_on_error: bool,
    ) -> None:
        super().__init__(sent, raise_on_error)
        self._responses = responses

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._complete:
            raise StopIteration
        return self._taken(self._responses.get())


class AsyncResponseIterator(_Iteration):
    """A request's responses, for an ``async for`` loop on the caller's event loop."""

    def __init__(
        self,
        responses: asyncio.Queue[InferenceResponse],
        sent: concurrent.futures.Future[None],
        raise_on_error: bool,
    ) -> None:
        super().__init__(sent, raise_on_error)
        self._responses = responses

    def __aiter__(self) -> AsyncResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._complete:
            raise StopAsyncIteration
        return self._taken(await self._responses.get())


def queued_for(
    own: queue.SimpleQueue[InferenceResponse], callers: Any
) -> Callable[[InferenceResponse], None]:
    """Put a response in the iterator's queue, and in the caller's if given."""

    def put(response: InferenceResponse) -> None:
        own.put(response)
        if callers is not None:
            callers.put(response)

    return put


def queued_on(
    loop: asyncio.AbstractEventLoop, own: asyncio.Queue[InferenceResponse], callers: Any
) -> Callable[[InferenceResponse], None]:
    """Put a response in asyncio queues on the caller's ``loop`` (from another thread)."""

    def put(response: InferenceResponse) -> None:
        loop.call_soon_threadsafe(own.put_nowait, response)
        if callers is not None:
            loop.call_soon_threadsafe(callers.put_nowait, response)

    return put
