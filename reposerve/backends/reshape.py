"""Triton's ``reshape`` on inputs and outputs, around any backend.

A tensor with ``reshape`` is seen by clients in its ``shape`` (``dims``) and by the model in
its ``reshape``; the batch dimension, when the model batches, stays first in both. Inputs
are reshaped on their way into ``execute`` and outputs on their way back, as numpy views
(no copy), so the instance worker and everything before it only ever see client shapes.

Only ``create_backend`` wraps a backend here, and only when the config has a reshape.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import numpy as np

from reposerve.backends.base import (
    Arrays,
    Backend,
    BackendError,
    DeviceOutput,
    Outputs,
    PartialOutputs,
    RequestAwareBackend,
    RequestResponse,
    RequestSlice,
    Signature,
)
from reposerve.backends.drive import as_async
from reposerve.config import ModelConfig


def needs_reshape(config: ModelConfig) -> bool:
    return any(tensor.reshape is not None for tensor in (*config.input, *config.output))


class ReshapedBackend:
    """``backend`` with the config's reshapes applied; every hook it has stays available
    (the worker looks hooks up by name, so a missing one must stay missing)."""

    def __init__(self, backend: Backend, config: ModelConfig) -> None:
        self._backend = backend
        self._batched = config.max_batch_size > 0
        self._inputs = {t.name: t.reshape for t in config.input if t.reshape is not None}
        self._outputs = {t.name: t.shape for t in config.output if t.reshape is not None}
        self.is_async = backend.is_async
        if hasattr(backend, "decoupled"):
            self.decoupled = backend.decoupled
        if isinstance(backend, RequestAwareBackend):  # it has execute_requests
            self._requests_backend = backend
            self.execute_requests = self._execute_requests
        for hook in ("register_host_buffer", "synchronize", "completed_config"):
            if hasattr(backend, hook):
                setattr(self, hook, getattr(backend, hook))

    def signature(self) -> Signature | None:
        return self._backend.signature()

    def execute(self, inputs: Arrays) -> Any:
        return self._answer(self._backend.execute(self._model_inputs(inputs)))

    def _execute_requests(
        self, inputs: Arrays, requests: Sequence[RequestSlice], cancelled: Callable[[int], bool]
    ) -> Any:
        execute = self._requests_backend.execute_requests
        return self._answer(execute(self._model_inputs(inputs), requests, cancelled))

    def unload(self) -> None:
        self._backend.unload()

    # -- the two directions -----------------------------------------------------------

    def _model_inputs(self, inputs: Arrays) -> Arrays:
        if not self._inputs:
            return inputs
        return {
            name: _reshaped(value, self._inputs.get(name), self._batched, name)
            for name, value in inputs.items()
        }

    def _client_outputs(self, outputs: Outputs) -> Outputs:
        if not self._outputs:
            return outputs
        return {
            name: _reshaped(value, self._outputs.get(name), self._batched, name)
            for name, value in outputs.items()
        }

    def _answer(self, answer: Any) -> Any:
        """Whatever execute returned (outputs, an awaitable of them, a stream of responses,
        a list of per-request responses) with its outputs in client shapes."""
        if inspect.isawaitable(answer):
            return self._awaited(answer)
        if isinstance(answer, AsyncIterator | Iterator):
            return self._stream(as_async(answer))
        return self._converted(answer)

    async def _awaited(self, answer: Any) -> Any:
        return self._converted(await answer)

    async def _stream(self, responses: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """A decoupled model's responses, sync or async (``drive``), each converted."""
        try:
            async for response in responses:
                yield self._converted(response)
        finally:
            close = getattr(responses, "aclose", None)
            if close is not None:
                await close()

    def _converted(self, answer: Any) -> Any:
        if isinstance(answer, list):
            return [self._converted(item) for item in answer]
        if isinstance(answer, RequestResponse):
            answer.outputs = self._client_outputs(answer.outputs)
            return answer
        if isinstance(answer, PartialOutputs):
            answer.outputs = self._client_outputs(answer.outputs)
            return answer
        if isinstance(answer, dict):
            return self._client_outputs(answer)
        return answer  # not outputs: the worker says what is wrong with it


def _reshaped(value: Any, shape: list[int] | None, batched: bool, name: str) -> Any:
    if shape is None:
        return value
    target = (value.shape[0], *shape) if batched and len(value.shape) > 0 else tuple(shape)
    if isinstance(value, np.ndarray):
        try:
            return value.reshape(target)
        except ValueError as exc:
            raise BackendError(
                f"tensor '{name}': shape {list(value.shape)} cannot be reshaped to "
                f"{list(target)} ({exc})"
            ) from exc
    if hasattr(value, "copy_into"):
        return _ReshapedOutput(value, target)
    return value  # neither: the worker reports the type


class _ReshapedOutput:
    """A device output seen in another shape: it copies into a view of the target."""

    def __init__(self, output: DeviceOutput, target: tuple[int, ...]) -> None:
        self._output = output
        size = int(np.prod(output.shape))
        known = int(np.prod([dim for dim in target if dim >= 0]))
        self.shape = tuple(size // max(known, 1) if dim < 0 else dim for dim in target)
        self.dtype = output.dtype

    def copy_into(self, target: np.ndarray) -> None:
        self._output.copy_into(target.reshape(self._output.shape))
