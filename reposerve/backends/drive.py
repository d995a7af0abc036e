"""One path for sync and async model code: it is written once, as coroutines and async
iterators, and a sync instance (which has no event loop) drives it with ``run_now``.

Nothing on that path suspends unless the model itself does: a sync model's generator is
stepped by ``as_async``'s iterator at once, and a sync instance's waits (for a Resume, for
a sender's next response) block its thread inside the coroutine instead of awaiting. So a
fix to how a batch runs or a stream flows is made once, for both kinds of model.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Coroutine, Iterator
from typing import Any, Protocol, TypeVar, overload

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends to its end, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError(
        "a sync instance's coroutine suspended: it awaited something only an event loop can wake"
    )


class _Stepped:
    """A sync iterator as an async one, each step taken at once; ``aclose`` closes it (the
    model's generator sees GeneratorExit at its ``yield``)."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator = iterator

    def __aiter__(self) -> _Stepped:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()


class Stream(Protocol[T_co]):
    """A decoupled model's responses as ``as_async`` gives them: an async iterator that its
    reader closes when it stops early (the model sees that at its ``yield``)."""

    def __aiter__(self) -> AsyncIterator[T_co]: ...

    def __anext__(self) -> Awaitable[T_co]: ...

    def aclose(self) -> Awaitable[object]: ...


@overload
def as_async(responses: Iterator[T] | AsyncGenerator[T, Any]) -> Stream[T]: ...


@overload
def as_async(responses: AsyncIterator[T]) -> AsyncIterator[T]: ...


def as_async(responses: Iterator[T] | AsyncIterator[T]) -> Stream[T] | AsyncIterator[T]:
    """A decoupled model's responses as an async iterator, whichever kind it returned: a
    generator's (sync or async, as every decoupled backend's) can be closed (``Stream``)."""
    if isinstance(responses, AsyncIterator):
        return responses
    return _Stepped(responses)
