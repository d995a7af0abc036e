"""Runs Execute frames against the backend: inputs as numpy views on the batch's slot,
outputs checked against the config and written straight into the slot after the inputs
(or, for a decoupled model, each response as it is produced).

One path for sync and async models (``backends.drive``): ``run`` is a coroutine, awaited
on an async instance's loop and driven with ``run_now`` on a sync instance, where nothing
in it suspends unless the model does.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from reposerve.backends import Backend
from reposerve.backends.base import DeviceOutput, RequestFailure, RequestResponse, RequestSlice
from reposerve.backends.drive import Stream, as_async
from reposerve.config import ModelConfig
from reposerve.datatypes import NUMPY_DTYPES, element_count, to_numpy, to_wire
from reposerve.errors import InvalidInput, ModelError
from reposerve.instance.arena import Slot, align
from reposerve.instance.calls import CALL_DEPTH
from reposerve.instance.channel import Channel
from reposerve.instance.faults import Aftermath, aftermath, free_device_memory
from reposerve.instance.messages import (
    AddSlot,
    Answer,
    DropSlot,
    Execute,
    Failure,
    Response,
    Result,
    TensorRef,
)

Output = np.ndarray | DeviceOutput | bytes | memoryview  # BYTES: already framed

Resumed = Callable[[int], Awaitable[bool]]
"""Waits until the front lets decoupled batch ``batch_id`` write its next response: True
on its Resume, False on its Cancel (on an async instance a Cancel cancels the batch's task
instead: CancelledError)."""


class OutputError(Exception):
    """What execute returned does not match the model's declared outputs."""


class BatchRunner:
    """Runs Execute frames against the backend, reading and writing the slots."""

    def __init__(self, backend: Backend, config: ModelConfig) -> None:
        self.backend = backend
        self.slots: dict[int, Slot] = {}
        self._config = config
        self._output_names = frozenset(spec.name for spec in config.output)
        self._batched = config.max_batch_size > 0
        # Optional hooks of backends that copy to a device (``StagingBackend``).
        self._register = getattr(backend, "register_host_buffer", None)
        self._synchronize = getattr(backend, "synchronize", None)
        self._registered: set[int] = set()  # ids of the mappings handed to the backend
        # Optional: a backend that answers per request (``RequestAwareBackend``).
        self._execute_requests = getattr(backend, "execute_requests", None)
        self.decoupled = config.decoupled
        self._is_async = backend.is_async

    async def run(self, message: Execute, channel: Channel, resumed: Resumed) -> Result | Failure:
        """One batch, from its slot to its answer: the inputs as views, execute (awaited on
        an async backend), the outputs checked and placed, or (decoupled) each response
        streamed as it comes (``stream``); an exception is the batch's Failure."""
        started = time.perf_counter_ns()
        depth = CALL_DEPTH.set(message.call_depth)  # nested batches set theirs over it
        try:
            slot, inputs = self.prepare(message)
            outputs = self.execute(message, slot, inputs)
            if self.decoupled:
                responses = as_async(outputs)
                return await self.stream(message, slot, responses, started, channel, resumed)
            if self._is_async:
                outputs = await outputs
            return self.finish(message, slot, outputs, started)
        except Exception as exc:
            return self.failure(message, exc)
        finally:
            CALL_DEPTH.reset(depth)

    def add_slot(self, message: AddSlot, fd: int) -> None:
        slot = Slot(fd, message.size)
        self.slots[message.slot] = slot
        self._pin(slot)

    def drop_slot(self, message: DropSlot) -> None:
        """The front shrank the pool: let go of a free slot (and its pin, if any)."""
        slot = self.slots.pop(message.slot, None)
        if slot is None:
            return
        if id(slot.buffer) in self._registered:
            self._registered.discard(id(slot.buffer))
            release = getattr(self.backend, "release_host_buffer", None)
            if release is not None:
                release(slot.buffer)
        slot.close()

    def prepare(self, message: Execute) -> tuple[Slot, dict[str, np.ndarray]]:
        slot = self.slots[message.slot]
        slot.remap(message.slot_size)
        self._pin(slot)
        view = memoryview(slot.buffer)
        inputs = {
            ref.name: to_numpy(ref.datatype, ref.shape, view[ref.offset : ref.offset + ref.nbytes])
            for ref in message.inputs
        }
        return slot, inputs

    def execute(self, message: Execute, slot: Slot, inputs: dict[str, np.ndarray]) -> Any:
        """Run the backend on the batch: per request when it asks for the boundaries, and
        then with how to read each request's cancel flag (the slot's first bytes, which
        the front raises when that request's caller cancels it)."""
        if self._execute_requests is None:
            return self.backend.execute(inputs)
        requests = message.requests
        if not requests:  # one request holding the whole batch (warmup): never cancelled
            items = message.inputs[0].shape[0] if self._batched and message.inputs else 1
            return self._execute_requests(inputs, [RequestSlice(items, "")], _never)

        def cancelled(index: int) -> bool:
            return slot.buffer[index] != 0

        return self._execute_requests(inputs, requests, cancelled)

    def finish(
        self, message: Execute, slot: Slot, outputs: object, started_ns: int
    ) -> Result | Failure:
        """Check the outputs and write each straight into the slot, after the inputs: the
        batch's, or (a list of ``RequestResponse``) each request's own."""
        compute_ns = time.perf_counter_ns() - started_ns
        try:
            if self._execute_requests is not None and isinstance(outputs, list):
                answers, failed = self._answers(message, slot, outputs)
                return Result(message.batch_id, slot.size, [], compute_ns, failed, answers)
            refs = self._place(message, slot, outputs)
        except OutputError as exc:  # the front names the model and version
            return Failure(message.batch_id, str(exc), invalid_input=False)
        return Result(message.batch_id, slot.size, refs, compute_ns)

    def _answers(
        self, message: Execute, slot: Slot, responses: list
    ) -> tuple[list[Answer], list[RequestFailure]]:
        """A per-request backend's one response per request, each placed on its own."""
        count = max(len(message.requests), 1)
        indexes = sorted(
            response.index for response in responses if isinstance(response, RequestResponse)
        )
        if indexes != list(range(count)):
            raise OutputError(f"execute answered requests {indexes} of a batch of {count}")
        answers: list[Answer] = []
        failed: list[RequestFailure] = []
        placed: list[TensorRef] = []
        for response in responses:
            if response.failure is not None:
                failed.append(response.failure)
                continue
            refs = self._place(message, slot, response.outputs, as_given=True, after=placed)
            placed += refs
            answers.append(Answer(response.index, refs, response.parameters))
        return answers, failed

    async def stream(
        self,
        message: Execute,
        slot: Slot,
        responses: Stream[Any],
        started_ns: int,
        channel: Channel,
        resumed: Resumed,
    ) -> Result | Failure:
        """Send each response of a decoupled batch as it comes, then end the batch. The
        next response is produced while the front reads the last one, and written only
        once the front says it has (``Resume``); a ``Cancel`` closes the generator."""
        sent = False
        waited_ns = 0  # for its clients: not compute time
        try:
            async for outputs in responses:
                if sent:
                    waiting = time.perf_counter_ns()
                    go_on = await resumed(message.batch_id)
                    waited_ns += time.perf_counter_ns() - waiting
                    if not go_on:
                        break  # its clients have gone
                channel.send(self._response(message, slot, outputs))
                sent = True
        except OutputError as exc:
            return Failure(message.batch_id, str(exc), invalid_input=False)
        except asyncio.CancelledError:
            pass  # its clients have gone (an async instance cancels the task)
        finally:
            # At once: the model sees GeneratorExit at its yield. A cancel while the model
            # cleans up changes nothing: it is ending already.
            with contextlib.suppress(asyncio.CancelledError):
                await responses.aclose()
        compute_ns = time.perf_counter_ns() - started_ns - waited_ns
        return Result(message.batch_id, slot.size, [], compute_ns)

    def _response(self, message: Execute, slot: Slot, produced: object) -> Response:
        """One response: to every request of the batch, or (``RequestResponse``) to one."""
        if not isinstance(produced, RequestResponse):
            refs = self._place(message, slot, produced)  # first: it may grow the slot
            return Response(message.batch_id, slot.size, refs)
        if not 0 <= produced.index < max(len(message.requests), 1):
            raise OutputError(f"a response to request {produced.index}, which the batch lacks")
        if produced.failure is not None:
            return Response(message.batch_id, slot.size, [], produced.index, True, produced.failure)
        refs = []
        if produced.outputs or not produced.final:  # a final one may carry nothing
            refs = self._place(message, slot, produced.outputs, as_given=True)
        return Response(
            message.batch_id,
            slot.size,
            refs,
            produced.index,
            produced.final,
            parameters=produced.parameters,
        )

    def _place(
        self,
        message: Execute,
        slot: Slot,
        outputs: object,
        as_given: bool = False,
        after: Sequence[TensorRef] = (),
    ) -> list[TensorRef]:
        """Check the outputs (the whole batch's, or ``as_given``: one request's, see
        ``_check_outputs``) and write each straight into the slot, after the inputs and
        the tensors ``after`` (other requests' answers already placed)."""
        batch_size = message.inputs[0].shape[0] if message.inputs else 1
        checked = self._check_outputs(outputs, batch_size, as_given)
        end = max((ref.offset + ref.nbytes for ref in (*message.inputs, *after)), default=0)
        offset = align(end)
        placed: list[tuple[TensorRef, Output]] = []
        for name, datatype, value in checked:
            shape = tuple(value.shape)
            placing: Output = value
            # BYTES (never a DeviceOutput) are framed here: their size is known only then
            if datatype == "BYTES" and isinstance(value, np.ndarray):
                placing = to_wire(datatype, value)
                nbytes = len(placing)
            else:
                nbytes = element_count(shape) * value.dtype.itemsize
            placed.append((TensorRef(name, datatype, shape, offset, nbytes), placing))
            offset = align(offset + nbytes)
        slot.ensure(offset)
        self._pin(slot)
        try:
            for ref, placing in placed:
                if isinstance(placing, bytes | memoryview):
                    slot.buffer[ref.offset : ref.offset + ref.nbytes] = placing
                    continue
                target: np.ndarray = np.ndarray(
                    placing.shape, placing.dtype, slot.buffer, ref.offset
                )
                if isinstance(placing, np.ndarray):
                    np.copyto(target, placing)
                else:
                    placing.copy_into(target)
        finally:
            # Even when a copy failed: none may land after the front took the slot back.
            if self._synchronize is not None:
                self._synchronize()
        return [ref for ref, _ in placed]

    def failure(self, message: Execute, exc: BaseException) -> Failure:
        if isinstance(exc, InvalidInput):  # the model's own words about the client's data
            return Failure(message.batch_id, exc.message, invalid_input=True)
        if isinstance(exc, ModelError):  # a message that says it all (Triton's form)
            traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
            return Failure(message.batch_id, exc.message, invalid_input=False, verbatim=True)
        traceback.print_exception(exc, file=sys.stderr)
        text = f"{type(exc).__name__}: {exc}"
        outcome = aftermath(exc)
        if outcome is Aftermath.OUT_OF_MEMORY:
            free_device_memory()
        elif outcome is Aftermath.POISONED:
            return Failure(
                message.batch_id,
                f"{text} (a CUDA error that leaves the device unusable in this process: "
                "the instance is being replaced)",
                invalid_input=False,
                fatal=True,
            )
        return Failure(message.batch_id, text, invalid_input=False)

    def _pin(self, slot: Slot) -> None:
        if self._register is not None and id(slot.buffer) not in self._registered:
            self._registered.add(id(slot.buffer))
            try:
                self._register(slot.buffer)
            except Exception as exc:  # unpinned memory is slower, never wrong
                print(f"shared memory not pinned, copies stay synchronous: {exc}", file=sys.stderr)

    def _check_outputs(
        self, outputs: object, batch_size: int, as_given: bool = False
    ) -> list[tuple[str, str, np.ndarray | DeviceOutput]]:
        """The outputs in config order, as their declared datatypes (``_conform``). The
        batch's must be every declared output in its declared shape; one request's own
        (``as_given``) may leave outputs out and have any shape, as Triton passes a
        python model's response through."""
        if not isinstance(outputs, dict):
            raise OutputError(
                f"execute() must return a dict of arrays, got {type(outputs).__name__}"
            )
        undeclared = [str(name) for name in outputs if name not in self._output_names]
        if undeclared:
            raise OutputError(
                f"execute() returned undeclared output(s) {', '.join(undeclared)}. "
                "Hint: declare them as [[output]] in config.toml, or stop returning them"
            )
        batched = self._config.max_batch_size > 0
        checked: list[tuple[str, str, np.ndarray | DeviceOutput]] = []
        for spec in self._config.output:
            if spec.name not in outputs and as_given:
                continue
            if spec.name not in outputs:
                returned = ", ".join(map(str, outputs)) or "nothing"
                raise OutputError(
                    f"execute() returned no output '{spec.name}' (returned: {returned})"
                )
            where = f"output '{spec.name}'"
            value = outputs[spec.name]
            if hasattr(value, "copy_into"):  # a DeviceOutput: already in the declared dtype
                if spec.datatype == "BYTES" or value.dtype != NUMPY_DTYPES[spec.datatype]:
                    raise OutputError(f"{where}: expected {spec.datatype}, got {value.dtype}")
            else:
                value = _conform(np.asarray(value), spec.datatype, where)
            if as_given:
                checked.append((spec.name, spec.datatype, value))
                continue
            dims = tuple(value.shape)
            if batched:
                if not dims or dims[0] != batch_size:
                    raise OutputError(
                        f"{where}: expected {batch_size} items on axis 0, got shape {list(dims)}"
                    )
                dims = dims[1:]
            if len(dims) != len(spec.shape) or any(
                want not in (-1, got) for want, got in zip(spec.shape, dims, strict=True)
            ):
                raise OutputError(f"{where}: expected item shape {spec.shape}, got {list(dims)}")
            checked.append((spec.name, spec.datatype, value))
        return checked


def _never(index: int) -> bool:
    return False


def _conform(array: np.ndarray, datatype: str, where: str) -> np.ndarray:
    """The one rule for an output whose dtype differs from its declared datatype.

    It is converted when numpy's ``same_kind`` casting allows it (float64 -> FP32,
    int64 -> INT32, int -> float, bool -> int) and every value fits the declared type;
    a conversion across kinds (float -> int, int -> bool, numbers <-> BYTES) or a value
    that does not fit (300 as UINT8, 1e39 as FP32) is an error naming the output.
    """
    if array.size == 0 and array.dtype.kind not in "OSU":  # no value to convert (Triton's rule)
        empty = object if datatype == "BYTES" else NUMPY_DTYPES[datatype]
        return np.empty(array.shape, dtype=empty)
    if datatype == "BYTES":
        if array.dtype.kind not in "OSU":
            raise OutputError(f"{where}: expected BYTES (bytes objects), got {array.dtype}")
        return array
    dtype = NUMPY_DTYPES[datatype]
    if array.dtype == dtype:
        return array
    if not np.can_cast(array.dtype, dtype, "same_kind"):
        raise OutputError(
            f"{where}: expected {datatype}, got {array.dtype}, which does not convert without "
            "changing its meaning. Hint: return the declared type, or declare this one"
        )
    converted = array.astype(dtype)
    if np.can_cast(array.dtype, dtype, "safe") or array.size == 0:
        return converted
    if dtype.kind == "f":
        lost = np.isinf(converted) & np.isfinite(array)
    else:  # integers: a value that did not survive the round trip did not fit
        lost = converted.astype(array.dtype) != array
    if lost.any():
        bad = array[lost].flat[0]
        raise OutputError(f"{where}: value {bad} returned as {array.dtype} does not fit {datatype}")
    return converted
