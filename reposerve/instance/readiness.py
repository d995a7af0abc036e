"""The front's side of a model's own readiness check (Triton's user-defined ``is_ready()``).

One query is in flight per instance at a time: whoever asks while it is unanswered waits
for the same answer, so a flood of health checks sends the model one question. A caller
waits at most ``TIMEOUT_S`` and then counts the model as not ready; the query stays in
flight, and the callers after it wait for its answer rather than asking again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from reposerve.instance.messages import ReadyAnswer, ReadyQuery

TIMEOUT_S = 5.0  # Triton's wait for is_ready(), per caller


class ReadinessCheck:
    def __init__(self, instance_name: str, send: Callable[[ReadyQuery], None]) -> None:
        self._instance_name = instance_name  # Triton's, as its messages name the instance
        self._send = send
        self._next_id = 0
        self._query_id = -1
        self._pending: asyncio.Future[str | None] | None = None

    async def ask(self) -> str | None:
        """None when the model says it is ready, else why it is not."""
        if self._pending is None or self._pending.done():
            self._next_id += 1
            self._query_id = self._next_id
            self._pending = asyncio.get_running_loop().create_future()
            self._send(ReadyQuery(self._query_id))
        try:
            return await asyncio.wait_for(asyncio.shield(self._pending), TIMEOUT_S)
        except TimeoutError:
            return "Timed out waiting for user-defined is_ready() response"

    def answered(self, answer: ReadyAnswer) -> None:
        if answer.query_id != self._query_id or self._pending is None or self._pending.done():
            return
        if answer.error:
            self._pending.set_result(answer.error)
        elif answer.ready:
            self._pending.set_result(None)
        else:
            self._pending.set_result(
                f"Model '{self._instance_name}' is not ready (user-defined check failed)."
            )

    def gone(self) -> None:
        """The process ended: the question in flight gets no answer from it."""
        if self._pending is not None and not self._pending.done():
            self._pending.set_result(
                f"Stub process '{self._instance_name}' is not healthy while waiting for "
                "user-defined is_ready() response"
            )
