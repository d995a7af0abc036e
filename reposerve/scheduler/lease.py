"""What a scheduler hands back: leases on a request's outputs where its instance wrote them.

A batch's outputs lie in its instance's shared-memory slot. Each request of the batch
gets a ``Lease``: its outputs as views on that slot and its response's parameters; the
slot is written again only once every lease cut from it is released. So the caller
encodes (or copies) straight out of shared memory, and results flow up as values: the
scheduler never calls into the layer above it. A decoupled model's responses come as a
``LeaseStream``, one lease per response. A small response is copied out at once, while the
stream holds only a few, so its instance goes straight on to the next; otherwise the
instance writes the next response only once the last one's leases are released. Either
way a slow reader holds its own generator: that is the stream's backpressure.

No lease is left holding a slot when its caller goes: a future cancelled before its
lease is set releases it (``deliver``), a caller cancelled after it was set but before
it resumed releases it (``take``, how every caller awaits one), and a cancelled stream
releases what it still holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from reposerve.instance.outcomes import SlotHold
from reposerve.scheduler.stream import Stream
from reposerve.tensor import Tensor


class Lease:
    """One response's outputs (views valid until ``release``) and parameters; ``final``:
    the model marked it its request's last. Use as a context manager."""

    __slots__ = ("outputs", "parameters", "final", "_hold")

    def __init__(
        self,
        outputs: dict[str, Tensor],
        parameters: dict[str, Any],
        hold: SlotHold | None,
        final: bool = False,
    ) -> None:
        self.outputs = outputs
        self.parameters = parameters
        self.final = final
        self._hold = hold  # None: the outputs are its own (copied, or made in the front)

    @property
    def held(self) -> bool:
        return self._hold is not None

    @property
    def nbytes(self) -> int:
        return sum(len(tensor.raw) for tensor in self.outputs.values())

    def release(self) -> None:
        """Let the slot go (once; again is harmless). The outputs are invalid after it."""
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.release()

    def detach(self) -> Lease:
        """This lease with its outputs copied out of the slot, which it releases: for a
        response held back for a while (ordered delivery), so the slot is not."""
        owned = {
            name: Tensor(tensor.datatype, tensor.shape, bytes(tensor.memory()))
            for name, tensor in self.outputs.items()
        }
        self.release()
        return Lease(owned, self.parameters, None, self.final)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


async def take(future: asyncio.Future) -> Lease:
    """The lease ``future`` resolves to, safe against the one window awaiting it leaves:
    the lease set, then the awaiting task cancelled before it resumes (the lease would
    stay in the future, its slot held): it is released and the cancel goes on. (A
    Future subclass with this ``__await__`` costs the task its fast path, ~0.8 us.)"""
    try:
        return await future
    except BaseException:
        if future.done() and not future.cancelled() and future.exception() is None:
            future.result().release()
        # The error's traceback keeps this frame: were the future (which keeps the
        # error) still in it, the cycle would keep what the caller's frames hold (views
        # on shared memory, their mappings' descriptors) until a collection.
        del future
        raise


def deliver(future: asyncio.Future, lease: Lease | None, error: BaseException | None) -> None:
    """``future``'s lease or error, unless it has an outcome already (its caller left):
    then the lease is released."""
    if future.done():
        if lease is not None:
            lease.release()
    elif error is None:
        future.set_result(lease)
    else:
        future.set_exception(error)


# A stream copies a response out of the slot (so its instance need not wait for the front
# to encode it) while it holds fewer than this many, each at most this size: enough to
# cover a trip through the front, few and small enough that a stalled client costs little.
COPY_AHEAD = 4
COPY_AHEAD_BYTES = 64 * 1024


class LeaseStream(Stream[Lease]):
    """A decoupled request's responses, as leases, between the scheduler and a front.
    It holds the leases the front has not taken: a few small ones copied out of the
    slot, then at most one that holds it (its instance waits for it to be released);
    what arrives after its end is released, and cancelling it releases what it holds and
    stops the generation."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = False
        self.on_cancel: Callable[[], object] | None = None  # the scheduler's, once queued

    def put(self, lease: Lease) -> None:
        if self._ended:
            lease.release()
            return
        if lease.held and len(self._items) < COPY_AHEAD and lease.nbytes <= COPY_AHEAD_BYTES:
            lease = lease.detach()
        super().put(lease)

    def cancel(self) -> None:
        """The client has gone: release what is held and stop what is producing more."""
        if self.cancelled:
            return
        self.cancelled = True
        while self._items:
            self._items.popleft().release()
        # Stopped before it ends here: a Cancel ahead of the Resume spares one response.
        if self.on_cancel is not None and not self._ended:
            self.on_cancel()
        self.end()
