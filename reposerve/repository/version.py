"""One model version's lifecycle, a checked state machine:

    LOADING -> READY -> UNLOADING -> UNAVAILABLE ("unloaded")
    LOADING -> UNAVAILABLE (load failed)    READY -> UNAVAILABLE (an instance kept dying)

A version owns its instance processes, its scheduler and its statistics. It reaches
READY only when every instance has loaded and run the warmup batches. Unloading
has one deadline: accepted requests may finish before it, and get an error at it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec

from reposerve.config import ModelConfig
from reposerve.config.chat_templates import ChatTemplate
from reposerve.config.openai import check_openai
from reposerve.config.sequences import client_facing, model_facing
from reposerve.errors import (
    ConfigError,
    ErrorKind,
    InstanceError,
    ReposerveError,
    SchedulerError,
)
from reposerve.instance.messages import (
    Call,
    CallCancel,
    CallFailure,
    CallNext,
    CallResponse,
    CallResult,
    ModelControl,
)
from reposerve.instance.outcomes import BatchTensor, FailureCause
from reposerve.instance.process import InstanceProcess
from reposerve.pipelines.calls import serve_call
from reposerve.pipelines.ensemble import EnsembleScheduler, Serve, check_steps
from reposerve.repository.footprints import Footprint
from reposerve.repository.gpus import discover
from reposerve.repository.placement import plan_instances
from reposerve.repository.recovery import InstanceRestarter
from reposerve.repository.scan import VersionSource
from reposerve.repository.warmup import warm, warmup_batches
from reposerve.scheduler.batcher import Scheduler
from reposerve.scheduler.lease import LeaseStream
from reposerve.scheduler.sequences import SequenceBatcher
from reposerve.statistics import ModelStatistics, ModelStats

log = logging.getLogger("reposerve.repository")


Control = Callable[[ModelControl], Awaitable[CallResult | CallFailure]]
"""Serves a model's request to control the repository (``control.model_request``)."""


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


# The only moves a version makes; anything else is a bug, refused loudly.
_TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    ModelState.LOADING: frozenset({ModelState.READY, ModelState.UNAVAILABLE}),
    ModelState.READY: frozenset({ModelState.UNLOADING, ModelState.UNAVAILABLE}),
    ModelState.UNAVAILABLE: frozenset({ModelState.UNLOADING}),
    ModelState.UNLOADING: frozenset({ModelState.UNAVAILABLE}),
}


class ModelVersion:
    def __init__(
        self,
        name: str,
        config: ModelConfig,
        source: VersionSource,
        load_timeout: float,
        labels: dict[str, tuple[str, ...]] | None = None,
        chat_template: ChatTemplate | None = None,
        latency_summaries: bool = False,
        resolve: Callable[[str, str | None], ModelVersion] | None = None,
        serve: Serve | None = None,
        control: Control | None = None,
        restart_on_request: bool = False,
    ) -> None:
        """``resolve`` looks up other models (``Repository.get``): an ensemble's steps,
        which it runs on what ``serve`` gives (``Repository.serving``);
        ``control`` serves its models' requests to load and unload models;
        ``restart_on_request``: an instance that died is replaced once the next request
        comes, not at once (``--instance-restart on-request``, Triton's python backend)."""
        self.name = name
        self.version = source.number
        self.version_text = str(source.number)
        self.config = config
        self.backend = source.backend
        self.pipeline = source.pipeline
        self.source = source
        self.labels = labels or {}  # output -> class labels, for classification requests
        self.chat_template = chat_template  # [openai] kind = "chat"
        self.created = int(time.time())  # when it was loaded, as OpenAI's model list says
        self.state = ModelState.LOADING
        self.reason = ""
        self.unloaded = False  # taken out of service on purpose (not a failure)
        self.lost_a_step = False  # an ensemble whose step model went away (lost_step)
        self.statistics = ModelStatistics(name, source.number, latency_summaries)
        self.instances: list[InstanceProcess] = []
        self.footprint = Footprint()  # its memory, as last measured (footprints.measure)
        self.output_names: tuple[str, ...] = ()
        # Instances join the scheduler as they load; until READY nobody else submits.
        self.scheduler: Scheduler | SequenceBatcher | EnsembleScheduler
        if self.pipeline:
            if resolve is None or serve is None:
                raise ValueError(f"{self.label}: an ensemble needs a way to find its steps")
            self.scheduler = EnsembleScheduler(self.label, config, self.statistics, resolve, serve)
        else:
            self.scheduler = self._scheduler(config)
            if restart_on_request:
                self.scheduler.revive = self._revive
        self._restart_on_request = restart_on_request
        self._down: list[InstanceProcess] = []  # died; replaced when a request comes
        self._resolve = resolve
        self._control = control
        self._load_timeout = load_timeout
        self._restarter = InstanceRestarter(
            self.label,
            load_timeout,
            wanted=lambda: self.state is ModelState.READY,
            replaced=self._replace,
            on_exit=self._on_instance_exit,
            gave_up=self._give_up,
            prepare=self._warm,
            on_call=self._on_call,
        )
        # Model calls its instances made, under way, by the caller's pid.
        self._calls: dict[asyncio.Task, int | None] = {}
        # The calls its instances make, by (caller pid, call id), while they are served.
        self._links: dict[tuple[int | None, int], _CallLink] = {}
        self._warmups: list[list[BatchTensor]] = []  # built once the config is complete

    def _scheduler(self, config: ModelConfig) -> Scheduler | SequenceBatcher:
        if config.sequence_batching is None:
            return Scheduler(self.label, config, [], self.statistics)
        return SequenceBatcher(
            self.label, self.name, config, self.statistics, self.source.path.parent
        )

    def statistics_now(self) -> ModelStats:
        """Its statistics in Triton's shape, with its memory as last measured."""
        return msgspec.structs.replace(
            self.statistics.snapshot(), memory_usage=self.footprint.usage()
        )

    @property
    def label(self) -> str:
        return f"model '{self.name}' version {self.version}"

    @property
    def instance_scheduler(self) -> Scheduler | SequenceBatcher:
        """``scheduler`` of a model that runs in instances: every one but an ensemble."""
        scheduler = self.scheduler
        if isinstance(scheduler, EnsembleScheduler):
            raise TypeError(f"{self.label}: an ensemble runs in no instance")
        return scheduler

    @property
    def ready(self) -> bool:
        """READY with at least one live instance (not while every one is restarting, nor
        while the only one is being killed: it takes no more work)."""
        return (
            self.state is ModelState.READY
            and self.scheduler.serving
            and (not self.instances or any(instance.live for instance in self.instances))
        )

    async def check_ready(self) -> bool:
        """``ready``, asked as a client asks: also each live instance's model must agree
        when it has a check of its own (Triton's user-defined ``is_ready()``). Why not is
        logged in Triton's words, which its tests look for."""
        if not self.ready:
            if self.state is ModelState.READY and self.instances:  # none of them is live
                self._not_ready(f"Stub process '{self.instances[0].spec.name}' is not healthy.")
            return False
        live = [instance for instance in self.instances if instance.live]
        checks = [i.readiness.ask() for i in live if i.readiness is not None]
        for why in await asyncio.gather(*checks):
            if why is not None:
                self._not_ready(why)
                return False
        return True

    def _not_ready(self, why: str) -> None:
        log.warning("Model '%s' version %s is not ready: %s", self.name, self.version, why)

    @property
    def restarts(self) -> int:
        """Instance deaths the restarter has handled."""
        return self._restarter.deaths

    async def load(self) -> None:
        """Start every instance and run the warmup; on any failure end UNAVAILABLE. An
        ensemble starts nothing: it is checked against its step models as loaded."""
        if self.pipeline:
            assert self._resolve is not None
            try:
                check_steps(self.name, self.label, self.config, self._resolve)
            except ReposerveError as exc:
                self._fail(exc.message)
                return
            self.output_names = tuple(spec.name for spec in self.config.output)
            self._move(ModelState.READY)
            return
        try:
            gpus = await asyncio.to_thread(discover)  # a probe process, the first time only
            placement = plan_instances(
                self.name, self.version, self.source.path, self.backend, self.config, gpus
            )
            self.config = placement.config
            self.instances = [
                InstanceProcess(spec, self._on_instance_exit, self._on_call)
                for spec in placement.specs
            ]
            results = await asyncio.gather(
                *(instance.start(self._load_timeout) for instance in self.instances),
                return_exceptions=True,
            )
            errors = [result for result in results if isinstance(result, BaseException)]
            if errors:
                raise errors[0]
            # Every instance loaded the same file; the first one's completed config stands.
            loaded = self.instances[0].config
            completed = self.config if loaded is None else client_facing(loaded, self.config)
            scheduling = (completed.max_batch_size, completed.dynamic_batching, completed.decoupled)
            if scheduling != (
                self.config.max_batch_size,
                self.config.dynamic_batching,
                self.config.decoupled,
            ):
                # Auto-complete decided the batching (Triton's default-max-batch-size):
                # the scheduler, still without instances and requests, is made anew for it.
                self.scheduler = self._scheduler(completed)
                if self._restart_on_request:
                    self.scheduler.revive = self._revive
            self.config = completed
            problem = check_openai(completed)  # the tensors it declared as it loaded
            if problem:
                raise ConfigError(f"{self.label}: {problem}")
            # Derived once here rather than per request on the hot path.
            self.output_names = tuple(spec.name for spec in self.config.output)
            # the inputs the model reads, its sequence controls and state included (zeros)
            self._warmups = warmup_batches(model_facing(self.config))
            if isinstance(self.scheduler, SequenceBatcher):
                self.scheduler.load_initial_state()
            await asyncio.gather(*(self._warm(instance) for instance in self.instances))
            for instance in self.instances:  # one may have died during its warmup
                if not instance.live:
                    raise InstanceError(f"{instance.spec.label}: {instance.ended} after warmup")
                self.instance_scheduler.add_instance(instance)
        except ReposerveError as exc:
            self._fail(exc.message)
            return
        except asyncio.CancelledError:  # shutdown during start-up: leave no process behind
            self._fail("loading was cancelled")
            raise
        except Exception as exc:  # a bug or an OS limit: still only this model fails
            log.exception("%s: load failed", self.label)
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        self._move(ModelState.READY)

    async def unload(self, deadline: float) -> None:
        """Finish what was accepted by ``deadline`` (``time.monotonic``); what is still
        queued or running then fails with the reason, and the instances stop. Cancelled
        (a shutdown overtaking it), it fails what it holds at once."""
        self._move(ModelState.UNLOADING)
        self.unloaded = True
        self._restarter.cancel()
        try:
            if not self.pipeline and not self.scheduler.serving:
                # Every instance was dead: no one is coming.
                self._stop_now("no instance was running")
            try:
                await asyncio.wait_for(self.scheduler.drain(), max(deadline - time.monotonic(), 0))
            except TimeoutError:
                log.warning("%s: requests still pending at the deadline; failing them", self.label)
                self._stop_now("the unload budget, --exit-timeout-secs, ran out")
            await asyncio.gather(
                *(instance.stop(max(deadline - time.monotonic(), 0)) for instance in self.instances)
            )
        except asyncio.CancelledError:
            self._stop_now("the unload was cut short by the shutdown")
            raise
        finally:
            self._move(ModelState.UNAVAILABLE, "unloaded")

    def lost_step(self, reason: str) -> None:
        """A step model of this ensemble went away: it stops serving, saying why (a load
        of that model brings it back)."""
        if self.state is ModelState.READY:
            self.lost_a_step = True
            self._move(ModelState.UNAVAILABLE, reason)
            log.warning("%s is unavailable: %s", self.label, reason)

    def _stop_now(self, why: str) -> None:
        """Fail everything this version still holds, queued or running, and kill it."""
        reason = f"{self.label} was unloaded before this request finished ({why})"
        self.scheduler.abort(SchedulerError(reason))
        for instance in self.instances:
            instance.kill(reason, FailureCause.STOPPED)

    def _move(self, state: ModelState, reason: str = "") -> None:
        if state not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"{self.label}: no transition {self.state.value} -> {state.value}")
        self.state = state
        self.reason = reason

    def _fail(self, reason: str) -> None:
        for instance in self.instances:
            instance.kill()
        self._move(ModelState.UNAVAILABLE, reason)
        # Triton's words, which its tests look for in the log.
        log.error("failed to load '%s' version %s: %s", self.name, self.version, reason)

    def _give_up(self, reason: str) -> None:
        """An instance keeps dying: the version stops serving, and says why."""
        if self.state is not ModelState.READY:
            return
        error = InstanceError(f"{self.label} is unavailable: {reason}")
        self.scheduler.abort(error)
        for instance in self.instances:
            instance.kill(error.message)
        self._move(ModelState.UNAVAILABLE, reason)
        log.error("%s is unavailable: %s", self.label, reason)

    def _on_instance_exit(self, instance: InstanceProcess) -> None:
        self.instance_scheduler.remove_instance(instance)
        for key, link in list(self._links.items()):
            if key[0] == instance.pid:  # nobody takes its calls' responses any more
                link.gone(InstanceError(f"{self.label}: the caller {instance.ended}"))
        for task, pid in list(self._calls.items()):
            if pid == instance.pid:  # orphans: their requests go, and the calls' slots
                task.cancel()
        if self.state is ModelState.READY:
            if self._restart_on_request and not instance.batch_fault:
                self._down.append(instance)
                log.error(
                    "%s: instance %s %s; it is replaced when the next request comes",
                    self.label,
                    instance.spec.name,
                    instance.ended,
                )
            else:
                self._restarter.restart(instance)
        elif self.scheduler.serving:
            return
        elif self.state is ModelState.UNLOADING:
            # No replacement comes while unloading: what is queued is answered now rather
            # than at the deadline.
            self._stop_now(f"its last instance {instance.ended} during the unload")
        elif self.state is ModelState.LOADING:  # e.g. during warmup: the load fails
            self.scheduler.abort(
                InstanceError(f"{self.label}: instance {instance.spec.index} {instance.ended}")
            )

    def _on_call(
        self, instance: InstanceProcess, call: Call | ModelControl | CallNext | CallCancel
    ) -> None:
        if isinstance(call, CallNext | CallCancel):
            link = self._links.get((instance.pid, call.call_id))
            if link is not None and isinstance(call, CallNext):
                link.took()
            elif link is not None:
                link.cancel()
            return
        if isinstance(call, ModelControl):
            self._track(instance, asyncio.ensure_future(self._serve_control(instance, call)))
            return
        if not isinstance(self.scheduler, EnsembleScheduler):  # the waiting instance has room
            self.scheduler.capacity_changed()
        self._track(instance, asyncio.ensure_future(self._serve_call(instance, call)))

    def _track(self, instance: InstanceProcess, task: asyncio.Task) -> None:
        self._calls[task] = instance.pid
        task.add_done_callback(lambda done: self._calls.pop(done, None))

    async def _serve_call(self, instance: InstanceProcess, call: Call) -> None:
        assert self._resolve is not None  # the repository gives every version one
        try:
            slot = instance.call_slot(call)
        except OSError as exc:  # the process went away meanwhile, or named no slot
            instance.answer_call(CallFailure(call.call_id, str(exc), ErrorKind.UNAVAILABLE))
            return

        key = (instance.pid, call.call_id)
        link = self._links[key] = _CallLink(instance)
        try:
            answer = await serve_call(call, slot, self._resolve, self.label, link)
        finally:
            del self._links[key]
        instance.answer_call(answer)

    async def _serve_control(self, instance: InstanceProcess, control: ModelControl) -> None:
        if self._control is None:
            reason = f"{self.label}: no repository control here"
            answer: CallResult | CallFailure = CallFailure(
                control.call_id, reason, ErrorKind.UNAVAILABLE
            )
        else:
            answer = await self._control(control)
        instance.answer_call(answer)

    def _revive(self) -> str | None:
        """A request came (``--instance-restart on-request``): replace the instances that
        died since the one before. When none is live it fails, in Triton's words, and the
        requests after it wait for the replacement."""
        if not self._down:
            return None
        down, self._down = self._down, []
        for instance in down:
            self._restarter.restart(instance)
        if self.scheduler.serving:
            return None
        name = down[0].spec.name
        return (
            f"Failed to process the request(s) for model instance '{name}', message: "
            f"Stub process '{name}' is not healthy."
        )

    def _replace(self, dead: InstanceProcess, replacement: InstanceProcess) -> None:
        self.instances[self.instances.index(dead)] = replacement
        self.instance_scheduler.add_instance(replacement)

    async def _warm(self, instance: InstanceProcess) -> None:
        await warm(instance, self._warmups, self.statistics, self.label)


class _CallLink:
    """One model call of an instance's, while it is served: how a decoupled callee's
    responses go back one by one (each once the caller took the one before), and how
    the caller cancels it."""

    def __init__(self, instance: InstanceProcess) -> None:
        self._instance = instance
        self._taken: asyncio.Future[None] | None = None
        self._stream: LeaseStream | None = None

    async def send(self, response: CallResponse) -> None:
        self._taken = asyncio.get_running_loop().create_future()
        self._instance.answer_call(response)
        await self._taken

    def attach(self, stream: LeaseStream) -> None:
        self._stream = stream

    def took(self) -> None:
        if self._taken is not None and not self._taken.done():
            self._taken.set_result(None)

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()

    def gone(self, error: InstanceError) -> None:
        if self._taken is not None and not self._taken.done():
            self._taken.set_exception(error)
        self.cancel()
