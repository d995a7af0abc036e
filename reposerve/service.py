"""The protocol-agnostic operations both fronts call.

Inference takes the request's bytes (decoded here against the model's config) and gives
back ``Answer``s: the outputs the request asked for, still in the instance's shared
memory, which the front encodes in its protocol and releases. Tensors a request places in
client shared memory (``reposerve.shared_memory``) are read from and written into the
client's regions here; the answer carries those outputs' metadata alone. Every other
operation is a typed value of ``reposerve.operations``, run by ``perform`` for its
result, which each front decodes and encodes in its own protocol. Status codes and headers
stay in the fronts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from reposerve.answers import Answer, Answers, make_answer, selected_outputs
from reposerve.config import ModelConfig
from reposerve.errors import (
    ConfigError,
    ErrorKind,
    ProtocolError,
    RepositoryError,
    SchedulerError,
)
from reposerve.logs import LogControl
from reposerve.operations import (
    CudaSharedMemoryRegisterRequest,
    CudaSharedMemoryStatusRequest,
    CudaSharedMemoryUnregisterRequest,
    IndexEntry,
    IndexRequest,
    LoadRequest,
    LogSettingsRequest,
    LogUpdateRequest,
    ModelConfigDocument,
    ModelConfigRequest,
    ModelMetadata,
    ModelMetadataRequest,
    ModelReadyRequest,
    ModelStatistics,
    ModelStatisticsRequest,
    OpenAIModel,
    OpenAIModelsRequest,
    Operation,
    ServerMetadataRequest,
    ServerReadyRequest,
    SystemSharedMemoryRegisterRequest,
    SystemSharedMemoryStatusRequest,
    SystemSharedMemoryUnregisterRequest,
    UnloadRequest,
)
from reposerve.protocol import documents
from reposerve.protocol.generate import decode_generate
from reposerve.protocol.request import Body, InferRequest, Raw, decode_parts, decode_request
from reposerve.protocol.shared_memory import may_read_bytes
from reposerve.repository import ModelState, ModelVersion, Repository
from reposerve.repository import openai_catalog as catalog
from reposerve.repository.control import RepositoryControl, model_request
from reposerve.shared_memory import MAX_REGIONS, Claims, SharedMemory

log = logging.getLogger("reposerve")

# Request bodies at least this large are decoded in a worker thread, so that walking one
# (its BYTES elements, its JSON numbers) never stalls the event loop that serves everyone.
DECODE_IN_THREAD = 1 << 20

R = TypeVar("R")


class InferenceService:
    def __init__(
        self,
        repository: Repository,
        model_control_mode: str = "explicit",
        strict_readiness: bool = True,
        allow_file_override: bool = False,
        logs: LogControl | None = None,
        server_name: str = documents.SERVER_NAME,
        allow_client_shm: bool = False,
        client_shm_max_regions: int = MAX_REGIONS,
    ) -> None:
        self.repository = repository
        # Loads and unloads on request (the control API), for fronts and models alike.
        self.control = RepositoryControl(repository, model_control_mode, allow_file_override)
        # --allow-client-shm, --client-shm-max-regions
        self.shared_memory = SharedMemory(allow_client_shm, max_regions=client_shm_max_regions)
        self.server_name = server_name  # what GET /v2 names the server (--server-name)
        self._logs = logs  # None: logging is not ours to change (an embedding process)
        self.model_control_mode = model_control_mode
        self._strict = strict_readiness
        self._started = False
        self._stopping = False
        # A model's own loads and unloads (pb_utils.load_model) are operations like a
        # front's: run by ``perform``, under the same rules.
        repository.model_control = lambda control: model_request(control, self.perform)

    # -- start-up and shutdown ---------------------------------------------------------

    async def start(self, names: list[str] | None) -> list[IndexEntry]:
        """Load ``names`` (every model on disk when None); failures leave others serving.
        Ensembles load after the models they call. Returns the index rows of the models
        that failed."""
        wanted = self.repository.names() if names is None else names
        steps = {name: set(self.repository.steps_of(name)) for name in wanted}
        while steps:
            # A wave: every model none of whose steps is still waiting (a cycle, refused
            # when loading, goes last).
            wave = [name for name, uses in steps.items() if not uses & steps.keys()] or list(steps)
            await asyncio.gather(*(self._load_quietly(name) for name in wave))
            for name in wave:
                del steps[name]
        self._started = True
        return self.repository.failed()

    def leave(self) -> None:
        """Report not ready from now on, still serving: the start of a shutdown."""
        self._stopping = True

    async def stop(self, deadline: float) -> None:
        """Refuse new work and unload every model by ``deadline`` (``time.monotonic``)."""
        self._stopping = True
        await self.repository.close(deadline)

    async def _load_quietly(self, name: str) -> None:
        # A broken model is recorded in the index and logged by the repository; one a
        # memory budget refused, in the index (its reason) and logged here.
        try:
            await self.repository.load(name)
        except ConfigError:
            pass
        except RepositoryError as exc:
            log.error("%s", exc.message)

    # -- health --------------------------------------------------------------------------

    def ready(self) -> bool:
        """Start-up loading done and not stopping; with strict readiness (Triton's
        default) also every model that should serve is ready."""
        if not self._started or self._stopping:
            return False
        return not self._strict or self.repository.all_ready()

    # -- the operations other than inference ----------------------------------------------

    async def perform(self, operation: Operation[R]) -> R:
        """Run ``operation`` (``reposerve.operations``) for its result: the one way every
        front, in this process or another, reaches the service's operations other than
        inference."""
        return cast(R, await self._perform(operation))

    async def _perform(self, operation: Operation[Any]) -> object:
        """Each operation's case: where an operation joins the service."""
        shared_memory = self.shared_memory
        match operation:
            case ServerReadyRequest():
                return self.ready()
            case ServerMetadataRequest():
                return documents.server_metadata(self.server_name, shared_memory.allowed)
            case ModelReadyRequest(name=name, version=version):
                return await self._model_ready(name, version)
            case ModelMetadataRequest(name=name, version=version):
                return self._model_metadata(name, version)
            case ModelConfigRequest(name=name, version=version):
                return self._model_config(name, version)
            case ModelStatisticsRequest(name=name, version=version):
                return await self._statistics(name, version)
            case IndexRequest(ready=ready):
                await self.repository.keeper.refresh()
                return self.repository.index(ready_only=ready)
            case LoadRequest():
                await self.control.load(operation)
            case UnloadRequest():
                await self.control.unload(operation)
            case OpenAIModelsRequest(name=name):
                return await self._openai_models(name)
            case LogSettingsRequest():
                return self._log_control().settings
            case LogUpdateRequest(update=update):
                return self._log_control().update(update)
            case SystemSharedMemoryStatusRequest(name=name):
                return shared_memory.status(name)
            case SystemSharedMemoryRegisterRequest(region=region):
                shared_memory.register(region)
            case SystemSharedMemoryUnregisterRequest(name=name):
                await shared_memory.unregister(name)
            case CudaSharedMemoryStatusRequest(name=name):
                return shared_memory.cuda_status(name)
            case CudaSharedMemoryRegisterRequest(name=name):
                await shared_memory.register_cuda(name)
            case CudaSharedMemoryUnregisterRequest(name=name):
                shared_memory.unregister_cuda(name)
            case _:
                raise TypeError(f"not an operation of the service: {operation!r}")
        return None

    # -- logging (Triton's logging extension) ----------------------------------------------

    def _log_control(self) -> LogControl:
        if self._logs is None:
            raise RepositoryError("log settings: this server does not manage its logging")
        return self._logs

    # -- metadata ------------------------------------------------------------------------

    def _model_metadata(self, name: str, version: str | None) -> ModelMetadata:
        try:
            model = self.repository.get(name, version)
        except RepositoryError as exc:
            backend, config, numbers = self._not_loaded(name, version, exc)
            return documents.model_metadata(name, numbers, backend, config)
        ready = [v.version for v in self.repository.versions(name) if v.state is ModelState.READY]
        return documents.model_metadata(name, ready, model.backend, model.config)

    def _model_config(self, name: str, version: str | None) -> ModelConfigDocument:
        try:
            model = self.repository.get(name, version)
        except RepositoryError as exc:
            backend, config, _ = self._not_loaded(name, version, exc)
            return documents.config_document(name, backend, config)
        return documents.config_document(name, model.backend, model.config)

    async def _model_ready(self, name: str, version: str | None) -> bool:
        """Ready to serve; in on-demand mode a model that is not loaded is, unless its
        last load failed or a budget refused it (its first request loads it)."""
        try:
            model = self.repository.get(name, version)
        except RepositoryError as exc:
            try:
                self._not_loaded(name, version, exc)
            except RepositoryError:
                return False
            return self.repository.refused(name) is None
        return await model.check_ready()

    def _not_loaded(
        self, name: str, version: str | None, error: RepositoryError
    ) -> tuple[str, ModelConfig, list[int]]:
        """An on-demand model that is not loaded, as ``Repository.describe`` has it;
        ``error`` (why ``get`` found no version to serve) otherwise."""
        if self.model_control_mode != "on-demand":
            raise error
        try:
            backend, config, numbers = self.repository.describe(name)
        except ConfigError:
            raise error from None
        if version and version not in {str(number) for number in numbers}:
            raise error
        return backend, config, numbers

    async def _statistics(self, name: str | None, version: str | None) -> ModelStatistics:
        if name is None:
            versions = self.repository.loaded()
        elif version:
            versions = [self.repository.get(name, version)]
        else:
            versions = self.repository.versions(name)
        await self.repository.keeper.refresh()
        return ModelStatistics([v.statistics_now() for v in versions])

    # -- inference -----------------------------------------------------------------------

    async def infer(
        self, name: str, version: str | None, body: Body, header_length: int | None
    ) -> Answer:
        """Run one V2 request (its JSON, or its header and binary tensors); the front
        encodes the answer and releases it."""

        async def decode(model: ModelVersion, claims: Claims) -> InferRequest:
            header = body if header_length is None else body[:header_length]
            if len(body) < DECODE_IN_THREAD and not may_read_bytes(header):
                return decode_request(body, header_length, model.config, name, claims)
            # millions of small BYTES elements take seconds to walk: not on the loop
            return await asyncio.to_thread(
                decode_request, body, header_length, model.config, name, claims
            )

        return await self._answer_once(name, version, decode)

    async def infer_parts(
        self, name: str, version: str | None, header: dict[str, Any], raws: Sequence[Raw]
    ) -> Answer:
        """Run one request whose tensor data travels apart from its header (gRPC; see
        ``decode_parts``)."""

        async def decode(model: ModelVersion, claims: Claims) -> InferRequest:
            return await _decode_parts(header, raws, model, name, claims)

        return await self._answer_once(name, version, decode)

    async def _answer_once(
        self,
        name: str,
        version: str | None,
        decode: Callable[[ModelVersion, Claims], Awaitable[InferRequest]],
    ) -> Answer:
        """A request decoded by ``decode``, run for its one answer. Its model is in use
        (never evicted) from here until its answer is made."""
        residency = self.repository.residency
        residency.begin(name)  # before its load: a model just loaded for it stays for it
        try:
            model = await self.repository.serving(name, version)
            claims = self.shared_memory.claims()
            try:
                return await self._run(model, await decode(model, claims), claims, version)
            except BaseException:
                claims.release()
                raise
        finally:
            residency.end(name)

    async def generate(self, name: str, version: str | None, body: bytes | bytearray) -> Answers:
        """Triton's generate extension (``reposerve.protocol.generate``): the request is
        decoded now (its errors raise here); the answers come as they are made."""
        in_use = self._in_use(name)
        try:
            model = await self.repository.serving(name, version)
            request = decode_generate(body, model.config, name)
        except BaseException:
            in_use()
            raise
        return self._answers(model, request, self.shared_memory.claims(), in_use)

    async def stream_parts(
        self, name: str, version: str | None, header: dict[str, Any], raws: Sequence[Raw]
    ) -> Answers:
        """``infer_parts`` for a streaming call: any model; a decoupled model's answers
        come as they are made, and end after its last."""
        in_use = self._in_use(name)
        claims = self.shared_memory.claims()
        try:
            model = await self.repository.serving(name, version)
            request = await _decode_parts(header, raws, model, name, claims)
        except BaseException:
            in_use()
            claims.release()
            raise
        return self._answers(model, request, claims, in_use)

    def _answers(
        self,
        model: ModelVersion,
        request: InferRequest,
        claims: Claims,
        in_use: Callable[[], None],
    ) -> Answers:
        """``_responses``, whose claims and use end even if it is never iterated."""
        answers = self._responses(model, request, claims, in_use)
        weakref.finalize(answers, in_use)
        if claims.held:
            weakref.finalize(answers, claims.release)
        return answers

    def _in_use(self, name: str) -> Callable[[], None]:
        """Mark ``name`` in use for a stream; the callable ends that, once."""
        residency = self.repository.residency
        residency.begin(name)
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                residency.end(name)

        return end

    async def _responses(
        self,
        model: ModelVersion,
        request: InferRequest,
        claims: Claims,
        in_use: Callable[[], None],
    ) -> AsyncGenerator[Answer, None]:
        """The answers to ``request``: one, or a decoupled model's as they come. Closing
        this iterator early (the client left) cancels the generation in the instance and
        releases what it had not handed out; its end lets go of ``claims`` and ends its
        model's use (``in_use``)."""
        try:
            selected = selected_outputs(request, model.output_names)
            if not model.config.decoupled:
                lease = await model.scheduler.lease(request)
                yield make_answer(model, request, selected, lease, True, claims)  # answered once
                return
            stream = model.instance_scheduler.stream(request)
            try:
                async for lease in stream:
                    yield make_answer(model, request, selected, lease, lease.final, claims)
            finally:
                stream.cancel()  # nothing left to stop once it has ended
        finally:
            in_use()
            claims.release()

    async def _run(
        self,
        model: ModelVersion,
        request: InferRequest,
        claims: Claims,
        version: str | None = None,
    ) -> Answer:
        """Submit ``request`` for its one response."""
        if model.config.decoupled:
            raise ProtocolError(
                f"model '{model.name}' is decoupled (it streams any number of responses), "
                "which a call answered once cannot carry. Hint: use a streaming call: HTTP "
                "POST .../generate_stream, or gRPC ModelStreamInfer",
                kind=ErrorKind.UNSUPPORTED,
            )
        selected = selected_outputs(request, model.output_names)
        try:
            lease = await model.scheduler.lease(request)
        except SchedulerError:
            if self.model_control_mode != "on-demand" or not model.unloaded:
                raise
            # Chosen for eviction just before this request marked it in use: it goes
            # to the model loaded again, as if it had come a moment later.
            model = await self.repository.serving(model.name, version)
            lease = await model.scheduler.lease(request)
        # The regions are the request's until its answer is let go.
        return make_answer(model, request, selected, lease, True, claims, hold=True)

    # -- the OpenAI-compatible routes ------------------------------------------------------

    async def _openai_models(self, name: str | None) -> list[OpenAIModel]:
        """The models that opt in to the OpenAI-compatible routes; ``name``: that one,
        ready to serve (loaded first in on-demand mode), with its chat template."""
        if name is None:
            others: dict[str, ModelConfig] = {}
            if self.model_control_mode == "on-demand":  # folders read off the loop
                others = await asyncio.to_thread(self._described)
            return catalog.listing(self.repository.loaded(), others)
        try:
            version = self.repository.get(name, None)
        except RepositoryError as exc:
            _, config, _ = self._not_loaded(name, None, exc)
            catalog.check_opted_in(name, config)  # not loaded for routes it is not on
            version = await self.repository.serving(name, None)
        return [catalog.served(version)]

    def _described(self) -> dict[str, ModelConfig]:
        """The config of every model on disk that can be read (the others serve nothing)."""
        configs = {}
        for name in self.repository.names():
            with contextlib.suppress(ConfigError):
                configs[name] = self.repository.describe(name)[1]
        return configs


async def _decode_parts(
    header: dict[str, Any], raws: Sequence[Raw], model: ModelVersion, name: str, claims: Claims
) -> InferRequest:
    """``decode_parts``, off the event loop when it reads BYTES from a region."""
    if may_read_bytes(header):
        return await asyncio.to_thread(decode_parts, header, raws, model.config, name, claims)
    return decode_parts(header, raws, model.config, name, claims)
