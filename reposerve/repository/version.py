"""One model version's lifecycle: LOADING -> READY -> UNLOADING -> UNAVAILABLE.

A version owns its instance processes, its scheduler and its statistics. It reaches
READY only when every instance has loaded and its warmup requests have run.
"""

from __future__ import annotations

import asyncio
import enum
import logging

import numpy as np

from reposerve.config import ModelConfig
from reposerve.datatypes import NUMPY_DTYPES, element_count, pack_bytes
from reposerve.errors import ReposerveError
from reposerve.instance.process import InstanceProcess
from reposerve.protocol.request import InferRequest
from reposerve.repository.placement import plan_instances
from reposerve.repository.recovery import InstanceRestarter
from reposerve.repository.scan import VersionSource
from reposerve.scheduler.batcher import Scheduler
from reposerve.statistics import ModelStatistics
from reposerve.tensor import Tensor

log = logging.getLogger("reposerve.repository")


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


class ModelVersion:
    def __init__(self, name: str, config: ModelConfig, source: VersionSource) -> None:
        self.name = name
        self.version = source.number
        self.version_text = str(source.number)
        self.config = config
        self.backend = source.backend
        self.source = source
        self.state = ModelState.LOADING
        self.reason = ""
        self.statistics = ModelStatistics(name, source.number)
        self.instances: list[InstanceProcess] = []
        self.output_names: tuple[str, ...] = ()
        self.scheduler: Scheduler | None = None
        self._restarter: InstanceRestarter | None = None

    @property
    def label(self) -> str:
        return f"model '{self.name}' version {self.version}"

    async def load(self, timeout: float) -> None:
        """Start every instance and run the warmup; on any failure end UNAVAILABLE."""
        try:
            specs = plan_instances(
                self.name, self.version, self.source.path, self.backend, self.config
            )
            self.instances = [InstanceProcess(spec, self._on_instance_exit) for spec in specs]
            results = await asyncio.gather(
                *(instance.start(timeout) for instance in self.instances), return_exceptions=True
            )
            errors = [result for result in results if isinstance(result, BaseException)]
            if errors:
                raise errors[0]
            # Every instance loaded the same file; the first one's completed config stands.
            self.config = self.instances[0].config or self.config
            # Derived once here rather than per request on the hot path.
            self.output_names = tuple(spec.name for spec in self.config.output)
            self.scheduler = Scheduler(self.label, self.config, self.instances, self.statistics)
            self._restarter = InstanceRestarter(
                self.label,
                timeout,
                wanted=lambda: self.state is ModelState.READY,
                replaced=self._replace,
                on_exit=self._on_instance_exit,
            )
            await self._warm_up()
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
        self.state = ModelState.READY

    async def unload(self, timeout: float) -> None:
        """Finish what was accepted, then stop the instances."""
        self.state = ModelState.UNLOADING
        if self._restarter is not None:
            self._restarter.cancel()
        if self.scheduler is not None:
            try:
                await asyncio.wait_for(self.scheduler.drain(), timeout)
            except TimeoutError:
                log.warning("%s: requests still running after %g s; stopping", self.label, timeout)
        await asyncio.gather(*(instance.stop(timeout) for instance in self.instances))
        self.state = ModelState.UNAVAILABLE
        self.reason = "unloaded"

    def _fail(self, reason: str) -> None:
        for instance in self.instances:
            instance.kill()
        self.state = ModelState.UNAVAILABLE
        self.reason = reason
        log.error("%s is unavailable: %s", self.label, reason)

    def _on_instance_exit(self, instance: InstanceProcess) -> None:
        if self.state is not ModelState.READY or self.scheduler is None:
            return
        self.scheduler.remove_instance(instance)
        assert self._restarter is not None
        self._restarter.restart(instance)

    def _replace(self, dead: InstanceProcess, replacement: InstanceProcess) -> None:
        self.instances[self.instances.index(dead)] = replacement
        assert self.scheduler is not None
        self.scheduler.add_instance(replacement)

    async def _warm_up(self) -> None:
        assert self.scheduler is not None
        rng = np.random.default_rng(0)
        batched = self.config.max_batch_size > 0
        for index, warmup in enumerate(self.config.warmup):
            inputs: dict[str, Tensor] = {}
            for spec in self.config.input:
                kind = warmup.inputs.get(spec.name, "zero")
                dims = tuple(1 if dim < 0 else dim for dim in spec.shape)
                shape = (warmup.batch_size, *dims) if batched else dims
                inputs[spec.name] = Tensor(
                    spec.datatype, shape, _sample(spec.datatype, shape, kind, rng)
                )
            request = InferRequest(
                id=f"warmup-{index}",
                inputs=inputs,
                batch_size=warmup.batch_size if batched else 1,
                outputs=None,
                binary_output=True,
                priority=0,
                timeout_us=0,
            )
            try:
                await self.scheduler.submit(request, lambda outputs: None)
            except ReposerveError as exc:
                raise ReposerveError(
                    f"{self.label}: warmup[{index}] failed: {exc.message}"
                ) from exc


def _sample(datatype: str, shape: tuple[int, ...], kind: str, rng: np.random.Generator) -> bytes:
    """Warmup data: zeros, or random values valid for every datatype (small ints, [0, 1) floats)."""
    count = element_count(shape)
    if datatype == "BYTES":
        return pack_bytes([b"" if kind == "zero" else rng.bytes(8) for _ in range(count)])
    dtype = NUMPY_DTYPES[datatype]
    if kind == "zero":
        return bytes(count * dtype.itemsize)
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(np.bool_).tobytes()
    if datatype == "BF16":
        floats = rng.random(count, dtype=np.float32)
        return (floats.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    if dtype.kind == "f":
        return rng.random(count).astype(dtype).tobytes()
    return rng.integers(0, 100, count).astype(dtype).tobytes()
