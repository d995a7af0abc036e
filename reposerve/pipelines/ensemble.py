"""Ensembles: a request flows through the steps of a pipeline declared in the config.

Each step is a model of the repository, called through that model's own scheduler like
any request, so calls from many ensemble requests are batched together at every stage.
A step starts as soon as every tensor it reads exists, so independent branches run at the
same time. Step models are looked up per request: reloading one swaps it under the
ensemble without a gap. Tensors between steps are copied once out of the producing
instance's shared memory and once into the consuming instance's (its batch assembly):
they never pass through HTTP or JSON.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from reposerve.config import ModelConfig, TensorConfig
from reposerve.config.schema import EnsembleStep
from reposerve.errors import ConfigError, InstanceError, ReposerveError, SchedulerError
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.lease import Lease, deliver, take
from reposerve.statistics import FailureReason, ModelStatistics
from reposerve.tensor import Tensor


class StepScheduler(Protocol):
    async def lease(self, request: InferRequest, call_depth: int = 0) -> Lease: ...


class StepModel(Protocol):
    """What an ensemble needs of a loaded step model (a ModelVersion); read only."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> ModelConfig: ...

    @property
    def scheduler(self) -> StepScheduler: ...

    @property
    def label(self) -> str: ...


Resolve = Callable[[str, str | None], StepModel]
"""The READY version of a model (``Repository.get``); raises RepositoryError otherwise."""
Serve = Callable[[str, str | None], Awaitable[StepModel]]
"""The version to run a step on (``Repository.serving``): in on-demand mode a step that
is not loaded (an eviction took it as the ensemble came back) is loaded, and the
ensemble's request waits for it rather than failing."""


def step_version(step: EnsembleStep) -> str | None:
    return None if step.version < 0 else str(step.version)


def check_steps(name: str, label: str, config: ModelConfig, resolve: Resolve) -> None:
    """The step models as loaded against the ensemble ``name``: no ensemble reaches
    itself through them, each is ready, answers once, has the inputs and outputs the maps
    name, and every tensor's datatype and shape agree from the step that writes it to the
    steps that read it. Raises ConfigError naming the cycle, or the step and tensor."""
    check_acyclic(name, label, config, resolve)
    declared: dict[str, TensorConfig] = {tensor.name: tensor for tensor in config.input}
    batched = config.max_batch_size > 0
    models = {}
    for index, step in enumerate(config.step):
        where = f"{label}: step[{index}] ({step.model})"
        try:
            model = resolve(step.model, step_version(step))
        except ReposerveError as exc:
            raise ConfigError(f"{where}: {exc.message}") from None
        if model.config.decoupled:
            raise ConfigError(f"{where}: a decoupled model cannot be an ensemble step")
        if batched != (model.config.max_batch_size > 0):
            raise ConfigError(
                f"{where}: the ensemble's max_batch_size is {config.max_batch_size}, this "
                f"model's {model.config.max_batch_size}: both batch, or neither does"
            )
        if config.max_batch_size > model.config.max_batch_size > 0:
            raise ConfigError(
                f"{where}: the ensemble takes batches of up to {config.max_batch_size}, this "
                f"model of up to {model.config.max_batch_size}. Hint: lower the ensemble's "
                "max_batch_size"
            )
        models[index] = model
        for model_output, tensor in step.output_map.items():
            spec = _find(model.config.output, model_output, f"{where}: output_map", "output")
            declared[tensor] = spec
    for index, step in enumerate(config.step):
        where = f"{label}: step[{index}] ({step.model})"
        model = models[index]
        for model_input, tensor in step.input_map.items():
            spec = _find(model.config.input, model_input, f"{where}: input_map", "input")
            _agree(declared[tensor], spec, f"{where}: input_map.{model_input} ('{tensor}')")
        for spec in model.config.input:
            if spec.name not in step.input_map and not spec.optional:
                raise ConfigError(f"{where}: input_map: its input '{spec.name}' is not mapped")
    for output in config.output:
        _agree(declared[output.name], output, f"{label}: output '{output.name}'")


def check_acyclic(name: str, label: str, config: ModelConfig, resolve: Resolve) -> None:
    """Refuse an ensemble that reaches an ensemble again through its steps (itself, or
    another one that reaches itself): one request would call steps without end. Checked
    with ``config`` standing for ``name`` (the config being loaded, not the one serving)
    and the other ensembles as loaded now; Triton's words, with the whole path."""
    cleared: set[str] = set()  # ensembles whose steps reach no cycle

    def walk(path: tuple[str, ...], steps: list[EnsembleStep]) -> None:
        for step in steps:
            if step.model in path:
                cycle = (*path[path.index(step.model) :], step.model)
                raise ConfigError(
                    f"{label}: circular dependency between ensembles: {' -> '.join(cycle)}. "
                    "Hint: an ensemble cannot be a step of itself, directly or through "
                    "another ensemble"
                )
            if step.model in cleared:
                continue
            try:
                model = resolve(step.model, step_version(step))
            except ReposerveError:  # not loaded: the step checks say so
                continue
            if model.config.step:
                walk((*path, step.model), model.config.step)
            cleared.add(step.model)

    walk((name,), config.step)


def _find(specs: list[TensorConfig], name: str, where: str, kind: str) -> TensorConfig:
    for spec in specs:
        if spec.name == name:
            return spec
    names = ", ".join(spec.name for spec in specs)
    raise ConfigError(f"{where}: the model has no {kind} '{name}' (it has: {names})")


def _agree(written: TensorConfig, read: TensorConfig, where: str) -> None:
    if written.datatype != read.datatype:
        raise ConfigError(f"{where}: {written.datatype} is written, {read.datatype} is read")
    if len(written.shape) != len(read.shape) or any(
        -1 not in (a, b) and a != b for a, b in zip(written.shape, read.shape, strict=True)
    ):
        raise ConfigError(f"{where}: shape {written.shape} is written, {read.shape} is read")


class EnsembleScheduler:
    """Takes an ensemble's requests like a model's scheduler does, and runs each through
    the steps. Every accepted request ends with its result or the error of the step that
    failed (naming it), or with the reason when the ensemble is unloaded."""

    def __init__(
        self,
        label: str,
        config: ModelConfig,
        statistics: ModelStatistics,
        resolve: Resolve,
        serve: Serve,
    ) -> None:
        self._label = label
        self._config = config
        self._statistics = statistics
        self._resolve = resolve
        self._serve = serve
        self._running: dict[asyncio.Future, asyncio.Task] = {}
        self._closed = False
        self._aborted = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def pending(self) -> int:
        return len(self._running)

    @property
    def busy(self) -> bool:
        return bool(self._running)

    @property
    def serving(self) -> bool:
        """Whether every step model is ready now."""
        try:
            for step in self._config.step:
                self._resolve(step.model, step_version(step))
        except ReposerveError:
            return False
        return True

    async def lease(self, request: InferRequest, call_depth: int = 0) -> Lease:
        """As a model's scheduler: a lease on the outputs (copies of the steps' own: it
        holds no slot). ``call_depth``: the model calls that made the request; its
        steps' are as deep."""
        return await take(self.submit(request, call_depth))

    def submit(self, request: InferRequest, call_depth: int = 0) -> asyncio.Future:
        """Queue ``request`` now; the future resolves as ``lease`` does."""
        if self._closed:
            self._statistics.record_failure(1, 0, FailureReason.OTHER)
            raise SchedulerError(f"{self._label} is unloading; retry on another version")
        future = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._run(request, call_depth))
        self._running[future] = task
        self._idle.clear()
        task.add_done_callback(lambda done: self._settle(future, done))
        future.add_done_callback(self._forget)
        return future

    async def drain(self) -> None:
        self._closed = True
        await self._idle.wait()

    def abort(self, error: ReposerveError) -> None:
        """Fail every request still running with ``error``; refuse new ones."""
        self._closed = True
        self._aborted = True
        for future, task in list(self._running.items()):
            task.cancel()  # counted as it ends
            if not future.done():
                future.set_exception(error)

    def _settle(self, future: asyncio.Future, task: asyncio.Task) -> None:
        if task.cancelled():
            future.cancel()
        else:  # unless aborted, or its caller went away
            deliver(future, None if task.exception() else task.result(), task.exception())

    def _forget(self, future: asyncio.Future) -> None:
        task = self._running.pop(future, None)
        if task is not None and not task.done():  # its caller went away: stop the steps
            task.cancel()
        if not self._running:
            self._idle.set()

    async def _run(self, request: InferRequest, call_depth: int) -> Lease:
        started = time.perf_counter_ns()
        tensors: dict[str, Tensor] = dict(request.inputs)
        waiting = list(enumerate(self._config.step))
        running: dict[asyncio.Task, tuple[int, EnsembleStep]] = {}
        try:
            while waiting or running:
                for index, step in list(waiting):
                    if all(tensor in tensors for tensor in step.input_map.values()):
                        waiting.remove((index, step))
                        call = asyncio.ensure_future(
                            self._call(index, step, tensors, request, call_depth)
                        )
                        running[call] = (index, step)
                if not running:  # the load-time checks make this unreachable; never hang
                    raise InstanceError(f"{self._label}: steps wait for tensors none writes")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for call in done:
                    index, step = running.pop(call)
                    for model_output, tensor in call.result().items():
                        tensors[step.output_map[model_output]] = tensor
            outputs = {spec.name: tensors[spec.name] for spec in self._config.output}
            self._check_shapes(outputs, request.batch_size)
        except BaseException as exc:
            for call in running:
                call.cancel()
            elapsed = time.perf_counter_ns() - started
            if self._aborted:
                reason = FailureReason.OTHER
            elif isinstance(exc, asyncio.CancelledError):
                reason = FailureReason.CANCELED
            else:
                reason = FailureReason.BACKEND
            self._statistics.record_failure(1, elapsed, reason)
            raise
        elapsed = time.perf_counter_ns() - started
        self._statistics.record_batch(
            items=request.batch_size,
            requests=1,
            input_ns=0,
            infer_ns=elapsed,
            output_ns=0,
            success_ns=elapsed,
            queue_ns=0,
        )
        return Lease(outputs, {}, None)

    def _check_shapes(self, outputs: dict[str, Tensor], batch_size: int) -> None:
        """Each output has the shape the ensemble declares (its steps may declare a looser
        one, e.g. -1, and the load cannot know): one that does not fails the request."""
        batched = self._config.max_batch_size > 0
        for spec in self._config.output:
            produced = list(outputs[spec.name].shape)
            declared = [-1, *spec.shape] if batched else list(spec.shape)
            wanted = [batch_size, *spec.shape] if batched else declared
            if len(produced) != len(wanted) or any(
                want not in (-1, got) for want, got in zip(wanted, produced, strict=True)
            ):
                raise InstanceError(
                    f"{self._label}: output '{spec.name}': its steps produced shape "
                    f"{produced}, the ensemble declares {declared}"
                )

    async def _call(
        self,
        index: int,
        step: EnsembleStep,
        tensors: dict[str, Tensor],
        request: InferRequest,
        call_depth: int,
    ) -> dict[str, Tensor]:
        """One step: its inputs from the ensemble's tensors, through its model's scheduler;
        the outputs the ensemble keeps, copied out of the instance's shared memory."""
        where = f"{self._label}: step[{index}] ({step.model})"
        try:
            model = await self._serve(step.model, step_version(step))
            inputs = {name: tensors[tensor] for name, tensor in step.input_map.items()}
            batch_size = request.batch_size if model.config.max_batch_size > 0 else 1
            step_request = InferRequest(
                id=request.id,
                inputs=inputs,
                batch_size=batch_size,
                outputs=None,
                binary_output=True,
                priority=0,
                timeout_us=0,
                # a step that is a sequence model sees the ensemble request's sequence
                sequence_id=request.sequence_id,
                sequence_start=request.sequence_start,
                sequence_end=request.sequence_end,
            )
            with await model.scheduler.lease(step_request, call_depth=call_depth) as lease:
                return {
                    name: Tensor(tensor.datatype, tensor.shape, bytes(tensor.memory()))
                    for name, tensor in lease.outputs.items()
                    if name in step.output_map
                }
        except ReposerveError as exc:
            raise type(exc)(f"{where}: {exc.message}", exc.kind) from exc
