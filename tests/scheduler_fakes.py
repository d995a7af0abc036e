"""Fakes for the scheduler's tests, without processes or sleeping: a clock the test
moves, stand-in instances the test finishes (a model's, a decoupled model's), a small
model config and requests, and the scheduler they make."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

import numpy as np

from reposerve.config import parse_model_config
from reposerve.instance.outcomes import (
    STARTED,
    BatchFailure,
    BatchOutcome,
    FailureCause,
    SlotHold,
    StreamedResponse,
)
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.batcher import Scheduler
from reposerve.statistics import ModelStatistics
from reposerve.tensor import Tensor

US = 1000


class FakeTimer:
    def __init__(self, due: int, callback: Callable[[], None]) -> None:
        self.due = due
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    def __init__(self) -> None:
        self.ns = 0
        self.timers: list[FakeTimer] = []

    def now(self) -> int:
        return self.ns

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.ns + delay_ns, callback)
        self.timers.append(timer)
        return timer

    def advance(self, ns: int) -> None:
        self.ns += ns
        due = sorted((t for t in self.timers if t.due <= self.ns), key=lambda t: t.due)
        self.timers = [t for t in self.timers if t.due > self.ns]
        for timer in due:
            if not timer.cancelled:
                timer.callback()


class StandInInstance:
    """Records the batches it is given; the test finishes them (Y = X) when it likes."""

    def __init__(self, capacity: int = 1, staging: int = 0) -> None:
        self.capacity = capacity
        self.staging = staging
        self.running: list[tuple[np.ndarray, Callable]] = []
        self.batches: list[np.ndarray] = []
        self.freed: list[int] = []  # the slots given back, by the order their batches ended

    @property
    def in_flight(self) -> int:
        return len(self.running)

    per_request = False

    def has_capacity(self, staged: bool = False) -> bool:
        return len(self.running) < self.capacity + (self.staging if staged else 0)

    def run(self, inputs, on_event, requests=(), call_depth=0) -> int:
        (tensor,) = inputs
        batch = np.frombuffer(b"".join(tensor.parts), np.float32).reshape(tensor.shape)
        self.running.append((batch, on_event))
        self.batches.append(batch)
        if len(self.running) <= self.capacity:  # else staged: starts later
            on_event(STARTED)
        return len(self.batches)

    def finish(self, index: int = 0) -> None:
        batch, on_event = self._take(index)
        slot = SlotHold(partial(self.freed.append, len(self.freed)))
        try:
            on_event(
                BatchOutcome(
                    {"Y": Tensor("FP32", batch.shape, memoryview(batch.tobytes()))}, 0, slot
                )
            )
        finally:
            slot.release()  # as an instance does once its outcome is received

    def fail(self, message: str, cause: FailureCause = FailureCause.MODEL) -> None:
        _, on_event = self._take(0)
        on_event(BatchFailure(message, cause))

    def _take(self, index: int) -> tuple[np.ndarray, Callable]:
        taken = self.running.pop(index)
        if len(self.running) >= self.capacity:
            self.running[self.capacity - 1][1](STARTED)  # the first staged batch moves up
        return taken


def model_config(batching: str | None, max_batch: int = 8, dims: str = "[2]"):
    text = f"""
        max_batch_size = {max_batch}
        [[input]]
        name = "X"
        datatype = "FP32"
        shape = {dims}
        [[output]]
        name = "Y"
        datatype = "FP32"
        shape = {dims}
    """
    if batching is not None:
        text += f"[dynamic_batching]\n{batching}\n"
    return parse_model_config(text, "m/config.toml")


def make_request(values, priority: int = 0, timeout_us: int = 0) -> InferRequest:
    array = np.asarray(values, np.float32)
    return InferRequest(
        id=None,
        inputs={"X": Tensor("FP32", array.shape, memoryview(array.tobytes()))},
        batch_size=array.shape[0],
        outputs=None,
        binary_output=False,
        priority=priority,
        timeout_us=timeout_us,
    )


def lease_value(future: asyncio.Future) -> np.ndarray:
    """The request's Y, copied out of its lease, which is released."""
    with future.result() as lease:
        y = lease.outputs["Y"]
        return np.frombuffer(y.raw, np.float32).reshape(y.shape).copy()


async def turn() -> None:
    """Let call_soon callbacks (the dispatcher) run."""
    for _ in range(3):
        await asyncio.sleep(0)


def scenario(
    batching: str | None, instances: int = 1, capacity: int = 1, staging: int = 0, **config
):
    clock = FakeClock()
    stand_ins = [StandInInstance(capacity, staging) for _ in range(instances)]
    scheduler = Scheduler(
        "model 'm' version 1",
        model_config(batching, **config),
        stand_ins,
        ModelStatistics("m", 1),
        clock,
    )
    return scheduler, stand_ins, clock


def run(test: Callable) -> None:
    asyncio.run(test())


class DecoupledStandIn:
    """An instance of a decoupled model: the test sends each response and ends batches.
    ``resumed`` counts the responses the scheduler let it go on from."""

    per_request = False

    def __init__(self) -> None:
        self.batches: list[tuple[np.ndarray, Callable]] = []
        self.cancelled: list[int] = []
        self.resumed = 0

    @property
    def in_flight(self) -> int:
        return len(self.batches)

    def has_capacity(self, staged: bool = False) -> bool:
        return not self.batches

    def run(self, inputs, on_event, requests=(), call_depth=0) -> int:
        (tensor,) = inputs
        batch = np.frombuffer(b"".join(tensor.parts), np.float32).reshape(tensor.shape)
        self.batches.append((batch, on_event))
        return 7 + len(self.batches)

    def respond(self, step: float, **response) -> None:
        """Send a response (``resumed`` counts it once the scheduler lets the instance go
        on)."""
        batch, on_event = self.batches[0]
        values = batch + step
        outputs = {"Y": Tensor("FP32", values.shape, memoryview(values.tobytes()))}
        on_event(StreamedResponse(outputs, resume=self._resume, **response))

    def _resume(self) -> None:
        self.resumed += 1

    def end(self, outcome: BatchOutcome | BatchFailure | None = None) -> None:
        _, on_event = self.batches.pop(0)
        on_event(outcome or BatchOutcome({}, 0, SlotHold(lambda: None)))

    def cancel(self, batch_id: int) -> None:
        self.cancelled.append(batch_id)
