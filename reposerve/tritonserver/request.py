"""``InferenceRequest``: Triton's request fields, and their reading as an embedded call's
inputs and options (the request's priority, timeout and sequence go as the V2 parameters
that carry them). What Triton refuses when it builds a request is refused here, before
anything is sent: a parameter of a type it has no setter for, an input it cannot take,
output memory on a GPU."""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from reposerve.embedded.tensors import CallOptions, RawTensor
from reposerve.tritonserver.errors import InvalidArgumentError
from reposerve.tritonserver.memory import DeviceOrMemoryType, on_host
from reposerve.tritonserver.tensor import Tensor

if TYPE_CHECKING:
    from reposerve.tritonserver.model import Model

# Triton's request flags (TRITONSERVER_RequestFlag)
SEQUENCE_START = 1
SEQUENCE_END = 2
_PARAMETER_TYPES = (str, int, float, bool)


class RequestFields(TypedDict, total=False):
    """An ``InferenceRequest``'s fields beside its model, as keywords."""

    request_id: str | None
    flags: int
    correlation_id: int | str | None
    priority: int
    timeout: int
    inputs: dict[str, Any]
    parameters: dict[str, str | int | bool | float]
    output_memory_type: DeviceOrMemoryType | None
    response_queue: queue.SimpleQueue[Any] | asyncio.Queue[Any] | None


@dataclass
class InferenceRequest:
    model: Model
    request_id: str | None = None
    flags: int = 0
    correlation_id: int | str | None = None
    priority: int = 0
    timeout: int = 0  # microseconds; 0: none
    inputs: dict[str, Tensor | Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: DeviceOrMemoryType | None = None
    # Each response goes here too, as it comes: a queue.SimpleQueue for infer(), an
    # asyncio.Queue for async_infer()
    response_queue: queue.SimpleQueue[Any] | asyncio.Queue[Any] | None = None

    def call(self) -> tuple[dict[str, RawTensor], CallOptions]:
        """The request's inputs and options, as the embedded server takes them."""
        if self.output_memory_type is not None:
            on_host(self.output_memory_type, "output_memory_type")
        inputs = {
            name: Tensor.from_object(value).raw_tensor() for name, value in self.inputs.items()
        }
        options: CallOptions = {"parameters": self._parameters()}
        if self.model.version != -1:
            options["version"] = self.model.version
        if self.request_id is not None:
            options["request_id"] = self.request_id
        return inputs, options

    def _parameters(self) -> dict[str, Any]:
        parameters: dict[str, Any] = {}
        for name, value in self.parameters.items():
            if type(value) not in _PARAMETER_TYPES:
                raise InvalidArgumentError(
                    f"request parameter '{name}': expected str, int, float or bool, got "
                    f"{type(value).__name__} {value!r}"
                )
            parameters[name] = value
        if self.priority:
            parameters["priority"] = self.priority
        if self.timeout:
            parameters["timeout"] = self.timeout
        if self.correlation_id is not None:
            parameters["sequence_id"] = self.correlation_id
        if self.flags & SEQUENCE_START:
            parameters["sequence_start"] = True
        if self.flags & SEQUENCE_END:
            parameters["sequence_end"] = True
        return parameters
