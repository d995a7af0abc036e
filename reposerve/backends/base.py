"""What every backend offers the instance worker, and what it is told at load."""

from __future__ import annotations

import mmap
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec
import numpy as np

from reposerve.config import ModelConfig, TensorConfig
from reposerve.errors import ErrorKind, ReposerveError


class BackendError(ReposerveError):
    """A model that cannot be loaded or returned something unusable."""


class ModelCaller(Protocol):
    """Calls to other models of the repository, through their schedulers."""

    async def infer(
        self, model: str, inputs: dict[str, np.ndarray], version: int | None = None
    ) -> dict[str, np.ndarray]: ...

    def infer_sync(
        self, model: str, inputs: dict[str, np.ndarray], version: int | None = None
    ) -> dict[str, np.ndarray]: ...

    async def call(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        version: int | None = None,
        parameters: str = "{}",
        timeout_us: int = 0,
    ) -> tuple[dict[str, np.ndarray], str]:
        """``infer`` with the request's parameters (a JSON object's text) and timeout:
        the outputs and the response's parameters."""
        ...

    def call_sync(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        version: int | None = None,
        parameters: str = "{}",
        timeout_us: int = 0,
    ) -> tuple[dict[str, np.ndarray], str]: ...

    def stream_sync(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        version: int | None = None,
        parameters: str = "{}",
        timeout_us: int = 0,
    ) -> Iterator[tuple[dict[str, np.ndarray], str]]:
        """A call to a decoupled model: each response's outputs and parameters."""
        ...

    async def stream(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        version: int | None = None,
        parameters: str = "{}",
        timeout_us: int = 0,
    ) -> Iterator[tuple[dict[str, np.ndarray], str]]:
        """``stream_sync`` from an async execute: returns once the first response has
        come, without blocking the instance's other batches."""
        ...

    def control(self, action: str, model: str, version: str = "", body: bytes = b"") -> str:
        """Load, unload or ask after a model ("load" | "unload" | "ready"), as the control
        API would: the answer's parameters (``{"ready": ...}``), or ModelCallError."""
        ...


class ModelContext(msgspec.Struct, frozen=True):
    """Handed to a model's ``load``: which version and instance it is, and where it runs;
    and ``infer`` / ``infer_sync`` to call other models of the repository (or itself)
    from ``execute``, through their own schedulers like any request."""

    model_name: str
    config: ModelConfig
    version: int
    version_path: Path
    device: str  # "cpu" or "cuda:N" as the instance process sees it
    instance_index: int
    threads: int  # the instance's share of the CPU cores (intra-op threads)
    caller: ModelCaller | None = None  # None where no repository is reachable (tests)

    def model_file(self, default: str) -> Path:
        """The model file of this version: the config's ``default_model_filename`` (Triton's),
        else ``default``, the backend's own name for it."""
        return self.version_path / (self.config.default_model_filename or default)

    async def infer(
        self, model: str, inputs: dict[str, np.ndarray], version: int | None = None
    ) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs`` (batch on axis 0 when it batches); its outputs, or
        ``ModelCallError`` with what went wrong. For ``async def execute``."""
        return await self._caller().infer(model, inputs, version)

    def infer_sync(
        self, model: str, inputs: dict[str, np.ndarray], version: int | None = None
    ) -> dict[str, np.ndarray]:
        """``infer`` for a plain ``def execute``: blocks until the answer. Meanwhile the
        instance runs other batches it is given, so a model may call itself."""
        return self._caller().infer_sync(model, inputs, version)

    def _caller(self) -> ModelCaller:
        if self.caller is None:
            raise BackendError(f"model '{self.model_name}': no repository to call models in")
        return self.caller


class DeviceOutput(Protocol):
    """An output a backend holds where numpy cannot see it (a GPU tensor, a torch tensor).

    The worker writes it straight into the shared-memory slot instead of materialising an
    array first and copying that again. ``dtype`` is the declared datatype's numpy dtype
    (the backend converts before it hands the output over).
    """

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def copy_into(self, target: np.ndarray) -> None:
        """Write the values into ``target`` (C-contiguous, ``shape``, ``dtype``); may be
        asynchronous until the backend's ``synchronize``."""
        ...


Arrays = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray | DeviceOutput]
Responses = Iterator[Any] | AsyncGenerator[Any, Any]
"""What a decoupled backend's execute returns: a generator (sync or async) of its responses
as it produces them, each ``Outputs`` for every request of the batch or a
``RequestResponse`` for one of them."""
Signature = tuple[list[TensorConfig], list[TensorConfig]]
"""A model file's (inputs, outputs), full shapes with -1 where dynamic."""


class Backend(Protocol):
    """A loaded model. A backend with ``decoupled = True`` returns ``Responses`` (a
    generator: as many responses as it produces for the batch) from ``execute``; those
    without the attribute return outputs, or (a ``RequestAwareBackend``) its ``Answers``."""

    is_async: bool

    def signature(self) -> Signature | None:
        """What the model file says its tensors are, when it says (auto-complete)."""
        ...

    def execute(
        self, inputs: Arrays
    ) -> Outputs | Awaitable[Outputs] | Responses | Answers | Awaitable[Answers]: ...

    def unload(self) -> None: ...


class StagingBackend(Protocol):
    """Optional hooks of a backend that moves tensors to and from a device."""

    def register_host_buffer(self, buffer: mmap.mmap) -> None:
        """Called for every shared-memory mapping inputs are read from and outputs written
        to, so a GPU backend can pin it (page-locked memory makes copies asynchronous)."""
        ...

    def synchronize(self) -> None:
        """Wait until every ``DeviceOutput.copy_into`` of the batch has landed."""
        ...


class RequestSlice(msgspec.Struct, frozen=True, array_like=True):
    """One client request of a batch: how many items of axis 0 are its (in batch order;
    1 for a model without a batch dimension), the id the client gave it ("" if none), the
    outputs it asked for (None: every one) and its own parameters (a JSON object's text:
    those the server does not act on itself, as Triton hands them to the model)."""

    items: int
    id: str
    outputs: list[str] | None = None
    parameters: str = "{}"
    timeout_us: int = 0  # the request's own timeout (0: none given)
    correlation_id: int | str = 0  # its sequence's (0: none)
    flags: int = 0  # Triton's request flags: 1 starts its sequence, 2 ends it


class RequestFailure(msgspec.Struct, frozen=True, array_like=True):
    """One request of a batch that failed on its own; the others keep their results."""

    index: int  # its position in the batch
    message: str
    kind: ErrorKind  # how the front reports it (INVALID_ARGUMENT: the client's fault)


class PartialOutputs(msgspec.Struct):
    """What ``execute_requests`` returns when some requests failed: the batch's outputs
    (rows of failed requests hold placeholders, never sent) and which ones failed. When
    every request failed, ``outputs`` may be empty."""

    outputs: Outputs
    failures: list[RequestFailure]


class RequestResponse(msgspec.Struct):
    """One response to request ``index`` of the batch: its own outputs, in whatever shape
    the model gave them (a per-request backend's answers are not joined into the batch),
    its parameters (a JSON object's text) and whether it is that request's last. A
    ``failure`` ends the request with that error instead; a final response may carry no
    outputs (Triton's flag-only FINAL). A decoupled backend yields them one by one; a
    per-request backend may return a list of them, one final response per request."""

    index: int
    outputs: Outputs
    final: bool = False
    failure: RequestFailure | None = None
    parameters: str = "{}"


@runtime_checkable  # isinstance: whether a backend has the hook
class RequestAwareBackend(Protocol):
    """Optional hook of a backend that needs the request boundaries inside a batch (the
    Triton python-backend shim: one ``InferenceRequest`` per client request). The worker
    calls it instead of ``execute``."""

    def execute_requests(
        self,
        inputs: Arrays,
        requests: Sequence[RequestSlice],
        cancelled: Callable[[int], bool],
    ) -> Answers | Awaitable[Answers] | Responses:
        """``cancelled(i)``: whether request ``i``'s caller has cancelled it by now."""
        ...


Answers = list[RequestResponse]
"""What a per-request backend returns for a batch: one final response per request."""


class MetricState(msgspec.Struct, tag=True, array_like=True):
    """A model's own metric (Triton's custom metrics), whole, as it stands after a change:
    sent from the instance to the front, which shows it at ``GET /metrics``. ``removed``:
    its last holder is gone. A histogram's ``value`` is its sum."""

    family: str
    description: str
    kind: str  # "counter" | "gauge" | "histogram"
    labels: list[tuple[str, str]]
    value: float = 0.0
    buckets: list[float] = []
    bucket_counts: list[int] = []
    count: int = 0
    removed: bool = False


class MetricFamilyGone(msgspec.Struct, tag=True, array_like=True):
    """A model's metric family has ended, and every metric of it."""

    family: str


class ModelLog(msgspec.Struct, tag=True, array_like=True):
    """A line a model logs (Triton's ``pb_utils.Logger``): the front writes it through its
    own logging, so the server's log settings (``/v2/logging``, ``--log-verbose``) apply."""

    level: int  # a ``logging`` level (VERBOSE: logging.DEBUG)
    message: str
