"""The repository: which models and versions are loaded, and loading, swapping, unloading.

A (re)load builds the new versions beside the old ones and swaps each in only once it is
READY, so requests never see a gap; a new version that fails leaves the old one serving.
Loads and unloads of one model are serialised; different models proceed in parallel.
An unload, a retired version or a shutdown has one deadline (``unload_timeout`` from when
it was asked for), by which every request it held has its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from reposerve.config import ModelConfig
from reposerve.config.complete import require_declared
from reposerve.errors import ConfigError, ErrorKind, RepositoryError
from reposerve.operations import IndexEntry
from reposerve.pipelines.ensemble import check_steps
from reposerve.repository.fingerprint import Fingerprint, model_fingerprint
from reposerve.repository.keeper import BudgetKeeper
from reposerve.repository.override import OverrideFolder
from reposerve.repository.refusals import UNKNOWN, not_ready, unknown_model
from reposerve.repository.remote.mirrors import Mirrors
from reposerve.repository.residency import Residency
from reposerve.repository.roots import all_model_names, check_exists, find_root
from reposerve.repository.scan import ConfigOverride, check_model_name, read_model
from reposerve.repository.version import Control, ModelState, ModelVersion

log = logging.getLogger("reposerve.repository")
# How many times a request for an on-demand model follows it through evictions that
# overtake it before it fails with the reason (each a load of its own).
_EVICTIONS_OUTLIVED = 3
_FAILURE_RECHECK_S = 1.0

Files = tuple[tuple[Fingerprint, ...], ...]  # a model's and its steps' folders, as fingerprinted


class _Model:
    def __init__(self) -> None:
        self.versions: dict[int, ModelVersion] = {}
        self.loading: list[ModelVersion] = []  # a load's versions, until they swap in
        self.error = ""  # why the last load could not even start (config, layout)
        # The files (its folder's and its steps') a load from them failed with: on-demand
        # requests answer with that failure, not a new load, until they change.
        self.failed_with: Files | None = None
        self.failure_checked = 0.0  # when its files were last compared with failed_with
        self.lock = asyncio.Lock()
        # Folders written from load requests' files, until no version runs from them.
        self.overrides: list[OverrideFolder] = []

    def listed(self) -> dict[int, ModelVersion]:
        """Its versions as the index lists them: a load's under way stand in for those
        not serving (a first load shows LOADING, as in Triton's index)."""
        listed = dict(self.versions)
        for version in self.loading:
            current = listed.get(version.version)
            if current is None or current.state is not ModelState.READY:
                listed[version.version] = version
        return dict(sorted(listed.items()))

    def drop_unused_overrides(self) -> None:
        running = [v.source.path for v in self.versions.values() if not v.unloaded]
        for folder in list(self.overrides):
            if not any(folder.holds(path) for path in running):
                self.overrides.remove(folder)
                folder.remove()


class Repository:
    """``roots``: the repositories served as one (see ``reposerve.repository.roots``).
    ``auto_complete``: whether onnxruntime and torch models may leave their inputs and
    outputs to the model file. ``load_threads``: how many models build their instances
    at once (Triton's --model-load-thread-count); the others wait their turn.
    ``mirrors``: the remote repositories among ``roots`` (their cache folders), pulled
    from their buckets before a poll looks and before an explicit load."""

    def __init__(
        self,
        roots: Sequence[Path],
        load_timeout: float,
        unload_timeout: float,
        auto_complete: bool = True,
        load_threads: int = 4,
        latency_summaries: bool = False,
        restart_on_request: bool = False,
        residency: Residency | None = None,
        mirrors: Mirrors | None = None,
    ) -> None:
        self.roots = tuple(roots)
        self.mirrors = mirrors or Mirrors()
        # Memory budgets and the book eviction reads (reposerve.repository.residency).
        self.residency = residency or Residency()
        self.keeper = BudgetKeeper(
            self.residency,
            self.roots,
            self._serving_versions,
            lambda name, dependents: self.unload(name, dependents=dependents, spare_in_use=True),
        )
        self._on_demand: dict[str, asyncio.Future] = {}  # loads first requests wait for
        # name -> (backend, completed config, versions) as last loaded
        self._described: dict[str, tuple[str, ModelConfig, list[int]]] = {}
        self._restart_on_request = restart_on_request
        self._load_timeout = load_timeout
        self._unload_timeout = unload_timeout
        self._auto_complete = auto_complete
        self._loading = asyncio.Semaphore(load_threads)
        self._latency_summaries = latency_summaries
        self._models: dict[str, _Model] = {}
        self._closing = False
        # Serves models' own requests to load and unload models (Triton's
        # pb_utils.load_model): the service's, whose control API rules apply to them too.
        self.model_control: Control | None = None

    def names(self) -> list[str]:
        return all_model_names(self.roots)

    async def load(
        self,
        name: str,
        config: ConfigOverride | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> list[ModelVersion]:
        """Load or reload ``name`` from disk; returns the versions this load built (a
        failed one may have left its predecessor serving). Raises ConfigError when the
        model cannot even be read. ``config`` replaces the folder's config for this load;
        ``files`` (paths in the model folder -> content) replace the folder itself.
        An ensemble's step models that are not loaded load first (as in Triton); once
        ``name`` serves, the ensembles using it are checked against it again, and those
        that were waiting for it load."""
        return await self._load_with_steps(name, config, files, chain=())

    async def _load_with_steps(
        self,
        name: str,
        config: ConfigOverride | None,
        files: Mapping[str, bytes] | None,
        chain: tuple[str, ...],
    ) -> list[ModelVersion]:
        steps = self.steps_of(name)
        # An ensemble and its steps become resident as one unit: until the ensemble
        # serves (and so protects them), no budget decision evicts a step it needs.
        with self.residency.in_use(steps):
            for step in steps:
                if step not in chain and not self._serving(step):
                    with contextlib.suppress(ConfigError):  # the ensemble's load says why
                        await self._load_with_steps(step, None, None, (*chain, name))
            fresh = await self._load(name, config, files)
        if any(version.state is ModelState.READY for version in fresh):
            await self._refresh_dependents(name)
        return fresh

    def _serving(self, name: str) -> bool:
        model = self._models.get(name)
        return model is not None and any(
            v.state is ModelState.READY for v in model.versions.values()
        )

    async def _refresh_dependents(self, name: str) -> None:
        """``name`` was (re)loaded: ensembles using it are checked against it again (one
        that no longer fits stops, saying why), and those not serving load again."""
        waiting = []
        for ensemble, model in list(self._models.items()):
            for version in list(model.versions.values()):
                if not any(step.model == name for step in version.config.step):
                    continue
                if version.state is ModelState.READY:
                    try:
                        check_steps(version.name, version.label, version.config, self.get)
                    except ConfigError as exc:
                        version.lost_step(f"its step model '{name}' changed: {exc.message}")
                elif (
                    version.state is ModelState.UNAVAILABLE
                    and not version.unloaded
                    and ensemble not in waiting
                ):
                    waiting.append(ensemble)
        for ensemble in waiting:
            with contextlib.suppress(ConfigError):  # its own reason is in the index
                await self.load(ensemble)

    async def serving(self, name: str, version: str | None = None) -> ModelVersion:
        """The version to run a request on (``get``); in on-demand mode a model on disk
        that is not loaded is loaded first (its first requests wait for one load), and
        one evicted before the request took it is followed through a few loads more."""
        if not self.residency.on_demand:
            return self.get(name, version)
        for _ in range(_EVICTIONS_OUTLIVED):
            await self.ensure_loaded(name)
            try:
                return self.get(name, version)
            except RepositoryError:  # evicted again before this request took it
                if not self.evicted(name):
                    raise
        return self.get(name, version)

    async def ensure_loaded(self, name: str) -> None:
        """Load ``name`` unless it serves (on-demand mode: its first request). Requests
        that come while it loads wait for the same load, or for one under way from
        elsewhere (an explicit load, the poll); its failure is theirs."""
        if self._serving(name):
            return
        try:
            check_exists(self.roots, name)
        except ConfigError:
            return  # not a model: asking for it says so
        model = self._models.get(name)
        if model is not None and model.lock.locked():  # loading (or unloading) now
            async with model.lock:
                pass
            if self._serving(name):
                return
        if (
            model is not None
            and model.failed_with is not None
            and await self._unchanged_since_failure(model, name)
        ):
            return  # failed from these very files: get() says why, at once
        load = self._on_demand.get(name)
        if load is None:
            load = self._on_demand[name] = asyncio.ensure_future(self.load(name))
            load.add_done_callback(lambda done: self._on_demand.pop(name, None) and None)
            load.add_done_callback(_retrieved)
        with contextlib.suppress(ConfigError):  # its index entry and get() say why
            await asyncio.shield(load)  # a request that leaves does not stop the others

    async def _unchanged_since_failure(self, model: _Model, name: str) -> bool:
        """Whether ``name``'s files are still those its load failed with: looked at, at
        most once a second, so a flood of requests to a broken model walks its folders
        no more often (a change is seen within the second)."""
        now = time.monotonic()
        if now - model.failure_checked < _FAILURE_RECHECK_S:
            return True
        model.failure_checked = now
        return model.failed_with == await asyncio.to_thread(self._files, name)

    async def _load(
        self,
        name: str,
        config: ConfigOverride | None,
        files: Mapping[str, bytes] | None,
    ) -> list[ModelVersion]:
        self._refuse_if_closing(name)
        fresh = await self.keeper.load(name, lambda: self._load_now(name, config, files))
        serving = [v for v in fresh if v.state is ModelState.READY]
        if serving:  # its completed config, for when it is not loaded
            self._described[name] = (
                serving[-1].backend,
                serving[-1].config,
                [v.version for v in serving],
            )
        return fresh

    def _serving_versions(self) -> dict[str, list[ModelVersion]]:
        serving = {
            name: [v for v in model.versions.values() if v.state is ModelState.READY]
            for name, model in self._models.items()
        }
        return {name: versions for name, versions in serving.items() if versions}

    async def _load_now(
        self,
        name: str,
        config: ConfigOverride | None,
        files: Mapping[str, bytes] | None,
    ) -> list[ModelVersion]:
        self._refuse_if_closing(name)
        if name not in self._models:
            # Only real model folders get an entry: a bogus name leaves no trace behind
            # (a name in two repositories does: it is a model, with a problem to report).
            # A load that brings the model's files needs no folder (Triton's rule).
            if files:
                check_model_name(name)
            else:
                check_exists(self.roots, name)
        model = self._models.setdefault(name, _Model())
        async with model.lock:
            # Taken before reading them: a change during the load brings another.
            files_now = None if config or files else await asyncio.to_thread(self._files, name)
            # Written off the event loop: the files may be large.
            try:
                override = await asyncio.to_thread(OverrideFolder, name, files) if files else None
            except (OSError, ValueError) as exc:  # e.g. "1" given as a file and as a folder
                raise ConfigError(
                    f"load '{name}': the override files do not form a model folder: {exc}"
                ) from exc
            try:
                root = override.root if override else find_root(self.roots, name)
                source = read_model(root, name, config)
                if not self._auto_complete:
                    require_declared(source.config, {v.backend for v in source.versions}, name)
            except ConfigError as exc:
                if override:
                    override.remove()
                model.error = exc.message
                model.failed_with = files_now
                log.error("failed to load '%s': %s", name, exc.message)  # Triton's words
                raise
            model.error = ""
            if override:
                model.overrides.append(override)
            fresh = [
                ModelVersion(
                    name,
                    source.config,
                    version,
                    self._load_timeout,
                    source.labels,
                    chat_template=source.chat_template,
                    latency_summaries=self._latency_summaries,
                    restart_on_request=self._restart_on_request,
                    resolve=self.get,
                    serve=self.serving,
                    control=self.model_control,
                )
                for version in source.versions
            ]
            model.loading = fresh
            try:
                async with self._loading:
                    log.debug("loading %s (versions %s)", name, [v.number for v in source.versions])
                    await asyncio.gather(*(version.load() for version in fresh))
            finally:
                model.loading = []
            if self._closing:  # the shutdown came while this load ran: nothing swaps in
                await asyncio.gather(*(version.unload(time.monotonic()) for version in fresh))
                self._refuse_if_closing(name)
            old = model.versions
            current: dict[int, ModelVersion] = {}
            for version in fresh:
                previous = old.get(version.version)
                if (
                    version.state is not ModelState.READY
                    and previous is not None
                    and (previous.state is ModelState.READY)
                ):
                    log.error("%s: reload failed, version kept serving", previous.label)
                    current[version.version] = previous
                else:
                    current[version.version] = version
            model.versions = current
            serving = any(v.state is ModelState.READY for v in current.values())
            model.failed_with = None if serving else files_now
            retired = [
                version
                for version in old.values()
                if current.get(version.version) is not version and not version.unloaded
            ]
            deadline = time.monotonic() + self._unload_timeout
            await asyncio.gather(*(version.unload(deadline) for version in retired))
            model.drop_unused_overrides()
            return fresh

    async def unload(
        self,
        name: str,
        deadline: float | None = None,
        dependents: bool = False,
        spare_in_use: bool = False,
    ) -> None:
        """Unload every version of ``name`` by ``deadline`` (``time.monotonic``; default:
        the unload timeout from now, counting the wait for a load in progress). Ensembles
        using it stop serving, with the reason. ``dependents`` (Triton's
        ``unload_dependents``): an ensemble's step models go too, those no other loaded
        ensemble uses; with ``spare_in_use`` (an eviction) not those in use by then (a
        request, or the load of an ensemble that needs them: it came back meanwhile)."""
        model = self._models.get(name)
        if model is None:
            raise RepositoryError(f"unload: unknown model '{name}'")
        if deadline is None:
            deadline = time.monotonic() + self._unload_timeout
        steps = {step.model for v in model.versions.values() for step in v.config.step}
        await self._unload(name, model, deadline)
        for other in self._models.values():
            for version in other.versions.values():
                if any(step.model == name for step in version.config.step):
                    version.lost_step(f"its step model '{name}' was unloaded")
        if dependents:
            # Each step checked as it is reached, not once before: an unload awaits, and
            # an ensemble that loads again meanwhile (a request for it came back) uses the
            # steps it found serving.
            for step in sorted(steps):
                if (
                    step in self._models
                    and step not in self._steps_in_use()
                    and not (spare_in_use and self.residency.busy(step))
                ):
                    await self.unload(step, deadline, dependents=True, spare_in_use=spare_in_use)

    def _steps_in_use(self) -> set[str]:
        """The steps of every ensemble version not unloaded (serving, or loading)."""
        return {
            step.model
            for model in self._models.values()
            for version in model.versions.values()
            if not version.unloaded
            for step in version.config.step
        }

    def describe(self, name: str) -> tuple[str, ModelConfig, list[int]]:
        """``name`` when it is not loaded: its backend, config and versions as its last
        load completed them (an auto-completed model's tensors included), else as its
        folder says (ConfigError when it cannot be read)."""
        known = self._described.get(name)
        if known is not None:
            return known
        source = read_model(find_root(self.roots, name), name)
        if not source.versions:
            raise ConfigError(f"{name}: no version folder")
        return source.versions[-1].backend, source.config, [v.number for v in source.versions]

    def evicted(self, name: str) -> bool:
        """Whether ``name`` is out because a budget evicted it (so it may come back)."""
        model = self._models.get(name)
        return (
            model is not None
            and all(v.unloaded for v in model.versions.values())
            and self.residency.reasons.get(name, "").startswith("evicted")
        )

    def refused(self, name: str) -> str | None:
        """Why ``name`` is not serving, when its load failed or a budget refused it."""
        model = self._models.get(name)
        if model is not None and model.error:
            return model.error
        reason = self.residency.reasons.get(name)
        return reason if reason and not reason.startswith("evicted") else None

    def _files(self, name: str) -> Files:
        """What ``name`` loads from, to notice a change: its folders' fingerprints, and
        its steps' (an ensemble that failed for a step's sake may load once it is fixed)."""
        names = [name]
        for model in names:  # grows as steps are found; each model once
            names.extend(step for step in self.steps_of(model) if step not in names)
        return tuple(model_fingerprint(self.roots, model) for model in names)

    def steps_of(self, name: str) -> list[str]:
        """The models an ensemble on disk calls (none for another model, or one whose
        config cannot be read: its load reports that)."""
        try:
            return [
                step.model for step in read_model(find_root(self.roots, name), name).config.step
            ]
        except ConfigError:
            return []

    async def _unload(self, name: str, model: _Model, deadline: float) -> None:
        try:
            # A load in progress holds the lock; the deadline does not wait for it.
            await asyncio.wait_for(model.lock.acquire(), max(deadline - time.monotonic(), 0))
        except TimeoutError:
            log.warning("unload %s: a load still runs at the deadline; stopping what serves", name)
            # Without the lock: the running load may be reading an override folder that
            # no version holds yet, so none is removed here (the load's end drops them).
            await self._unload_versions(model, deadline, drop_overrides=False)
            return
        try:
            await self._unload_versions(model, deadline)
        finally:
            model.lock.release()

    async def close(self, deadline: float) -> None:
        """Unload everything by ``deadline``, and refuse loads from now on: the shutdown.
        Ensembles go first, so what they hold finishes while their steps still serve."""
        self._closing = True
        for load in list(self._on_demand.values()):  # their waiters get the shutdown's 503
            load.cancel()
        ensembles = [
            name
            for name, model in self._models.items()
            if any(version.pipeline for version in model.versions.values())
        ]
        await asyncio.gather(*(self.unload(name, deadline) for name in ensembles))
        rest = [name for name in self._models if name not in ensembles]
        await asyncio.gather(*(self.unload(name, deadline) for name in rest))

    @staticmethod
    async def _unload_versions(model: _Model, deadline: float, drop_overrides: bool = True) -> None:
        versions = [v for v in model.versions.values() if not v.unloaded]
        await asyncio.gather(*(version.unload(deadline) for version in versions))
        if drop_overrides:
            model.drop_unused_overrides()

    def _refuse_if_closing(self, name: str) -> None:
        if self._closing:
            raise RepositoryError(
                f"load '{name}': the server is shutting down", kind=ErrorKind.UNAVAILABLE
            )

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The READY version asked for (the newest READY one when ``version`` is empty)."""
        model = self._models.get(name)
        if model is None:
            raise RepositoryError(unknown_model(name))
        if version:
            number = int(version) if version.isdigit() else -1
            found = model.versions.get(number)
            if found is None:
                raise RepositoryError(f"{UNKNOWN} '{name}' version {version} is not found")
            if found.state is not ModelState.READY:
                subject = f"'{name}' version {version} is not at ready state"
                raise not_ready(subject, found.state, found.reason)
            return found
        # Versions are kept in ascending order: the first READY one from the end is newest.
        for candidate in reversed(model.versions.values()):
            if candidate.state is ModelState.READY:
                return candidate
        passing = [
            v.state for v in model.versions.values() if v.state is not ModelState.UNAVAILABLE
        ]
        reasons = [v.reason for v in model.versions.values() if v.reason] or [model.error]
        raise not_ready(
            f"'{name}' has no available versions",
            passing[-1] if passing else ModelState.UNAVAILABLE,
            "; ".join(dict.fromkeys(filter(None, reasons))),
        )

    def all_ready(self) -> bool:
        """Whether every version that should serve is ready (``--strict-readiness``):
        versions unloaded on purpose do not count; a model that failed to load does."""
        for model in self._models.values():
            if model.error and not model.versions:
                return False
            for version in model.versions.values():
                # An ensemble out because a step was unloaded on purpose is not a failure.
                if not version.unloaded and not version.lost_a_step and not version.ready:
                    return False
        return True

    def versions(self, name: str) -> list[ModelVersion]:
        model = self._models.get(name)
        if model is None:
            raise RepositoryError(unknown_model(name))
        return sorted(model.versions.values(), key=lambda v: v.version)

    def loaded(self) -> list[ModelVersion]:
        return [version for name in sorted(self._models) for version in self.versions(name)]

    def failed(self) -> list[IndexEntry]:
        """The index rows of the models whose load failed (or a memory budget refused):
        not those unloaded on purpose, nor ensembles that stopped because a step model
        was unloaded."""
        return [
            entry
            for entry in self.index()
            if self.refused(entry.name)  # a budget's refusal, loaded or not
            or entry.state == ModelState.UNAVAILABLE.value
            and not any(
                v.unloaded or v.lost_a_step
                for v in self._models[entry.name].versions.values()
                if str(v.version) == entry.version
            )
        ]

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model on disk or known, with each version's state."""
        entries: list[IndexEntry] = []
        for name in sorted(set(self.names()) | set(self._models)):
            model = self._models.get(name)
            listed = model.listed() if model else {}
            if model is None or (not listed and not model.error):
                if not ready_only:  # not loaded: why, when a budget kept it out
                    entries.append(IndexEntry(name, reason=self.residency.reasons.get(name, "")))
                continue
            if model.error and not listed:
                if not ready_only:
                    entries.append(IndexEntry(name, state="UNAVAILABLE", reason=model.error))
                continue
            why = self.residency.reasons.get(name)
            for number, version in listed.items():
                if ready_only and version.state is not ModelState.READY:
                    continue
                reason = why if why and version.unloaded else version.reason
                # Where the server manages memory; elsewhere the rows keep Triton's shape.
                shown = self.residency.tracking and version.state is ModelState.READY
                usage = version.footprint.usage() if shown else []
                entries.append(IndexEntry(name, str(number), version.state.value, reason, usage))
        return entries


# Triton's words for a request to a model it cannot serve; Triton's tests match them.
def _retrieved(load: asyncio.Future) -> None:
    """An on-demand load whose waiters all left: its error is in the index already."""
    if not load.cancelled():
        load.exception()
