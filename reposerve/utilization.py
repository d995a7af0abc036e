"""CPU and GPU utilisation and memory, sampled every ``--metrics-interval-ms`` on a thread.

The front's event loop never waits on ``/proc`` or on NVML (a wedged driver can hang an
NVML call for seconds): a daemon thread reads them and swaps in one frozen ``Usage``,
which a scrape reads as it is. CPU numbers come from ``/proc/stat`` (busy share of all
cores since the last sample, as Triton computes ``nv_cpu_utilization``) and
``/proc/meminfo`` (used = MemTotal - MemAvailable). GPU numbers come from NVML through
``nvidia-ml-py`` (the ``gpu`` extra), one row per physical GPU by UUID, as Triton labels
them; MIG slices are not sampled (NVML reports no utilisation for them).

The GPU probe in ``reposerve.repository.nvml`` stays what it is: a one-shot ctypes
listing run as a child process before placement. Sampling needs a library handle held
open for the server's life, which is what ``nvidia-ml-py`` is for.
"""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable
from pathlib import Path

import msgspec

log = logging.getLogger("reposerve.metrics")


class CpuUsage(msgspec.Struct, frozen=True):
    utilization: float  # 0..1, all cores, since the previous sample
    memory_total: int  # bytes
    memory_used: int  # bytes


class GpuUsage(msgspec.Struct, frozen=True):
    uuid: str
    utilization: float  # 0..1 over NVML's last sample period
    memory_total: int  # bytes
    memory_used: int  # bytes
    power_w: float | None = None  # None where the GPU does not report it
    power_limit_w: float | None = None
    energy_j: float | None = None  # since the sampler started


class Usage(msgspec.Struct, frozen=True):
    cpu: CpuUsage | None = None
    gpus: tuple[GpuUsage, ...] = ()


# -- CPU ---------------------------------------------------------------------------------


class CpuReader:
    """Reads ``/proc`` (Linux); the first reading's utilisation is 0, as in Triton."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._stat = proc / "stat"
        self._meminfo = proc / "meminfo"
        self._last: tuple[int, int] | None = None  # (busy, total) jiffies

    def read(self) -> CpuUsage:
        busy, total = self._jiffies()
        utilization = 0.0
        if self._last is not None and total > self._last[1]:
            utilization = (busy - self._last[0]) / (total - self._last[1])
        self._last = (busy, total)
        memory_total, memory_available = self._memory()
        return CpuUsage(
            utilization=min(max(utilization, 0.0), 1.0),
            memory_total=memory_total,
            memory_used=memory_total - memory_available,
        )

    def _jiffies(self) -> tuple[int, int]:
        # "cpu  user nice system idle iowait irq softirq steal guest guest_nice"; guest
        # time is inside user time already, so the first eight add up to the total.
        fields = [int(value) for value in self._stat.read_text().split("\n", 1)[0].split()[1:9]]
        total = sum(fields)
        idle = fields[3] + fields[4]  # idle + iowait
        return total - idle, total

    def _memory(self) -> tuple[int, int]:
        values: dict[str, int] = {}
        for line in self._meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                values[key] = int(rest.split()[0]) * 1024  # kB
        return values["MemTotal"], values["MemAvailable"]


# -- GPU ---------------------------------------------------------------------------------


class GpuReader:
    """NVML through ``nvidia-ml-py``'s ``pynvml`` module (or a stand-in with its API)."""

    def __init__(self, nvml: types.ModuleType) -> None:
        self._nvml = nvml
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._devices = [(handle, _text(nvml.nvmlDeviceGetUUID(handle))) for handle in handles]
        energy = nvml.nvmlDeviceGetTotalEnergyConsumption  # mJ since the driver loaded
        self._energy_start = {uuid: self._optional(energy, h) for h, uuid in self._devices}

    @property
    def count(self) -> int:
        return len(self._devices)

    def read(self) -> tuple[GpuUsage, ...]:
        nvml = self._nvml
        rows = []
        for handle, uuid in self._devices:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
            limit_mw = self._optional(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            energy_mj = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            start_mj = self._energy_start[uuid]
            rows.append(
                GpuUsage(
                    uuid=uuid,
                    utilization=nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100,  # percent
                    memory_total=int(memory.total),
                    memory_used=int(memory.used),
                    power_w=None if power_mw is None else power_mw / 1000,
                    power_limit_w=None if limit_mw is None else limit_mw / 1000,
                    energy_j=None
                    if energy_mj is None or start_mj is None
                    else (energy_mj - start_mj) / 1000,
                )
            )
        return tuple(rows)

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def _optional(self, call: Callable[[object], int], handle: object) -> int | None:
        """A reading some GPUs lack (power on many consumer boards): None there."""
        try:
            return call(handle)
        except self._nvml.NVMLError_NotSupported:
            return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older pynvml gave bytes


def open_gpu_reader() -> GpuReader | None:
    """NVML's reader, or None with a log line saying why there are no GPU metrics."""
    try:
        import pynvml
    except ImportError:
        log.info("no GPU metrics: nvidia-ml-py is not installed (pip install 'reposerve[gpu]')")
        return None
    try:
        reader = GpuReader(pynvml)
    except pynvml.NVMLError as exc:
        log.info("no GPU metrics: NVML is not available (%s)", exc)
        return None
    if not reader.count:
        reader.close()
        log.info("no GPU metrics: NVML lists no GPU")
        return None
    return reader


# -- the sampler -------------------------------------------------------------------------


class UsageSampler:
    """Samples every ``interval_s`` on a daemon thread; ``latest`` is the last sample."""

    def __init__(self, interval_s: float, cpu: bool, gpu: bool) -> None:
        self.latest = Usage()
        self._interval_s = interval_s
        self._cpu = cpu
        self._gpu = gpu
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="usage-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Ask the thread to end and wait a little; a hung NVML call may outlive this (the
        thread is a daemon, so it never holds the process up)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        cpu = CpuReader() if self._cpu and Path("/proc/stat").exists() else None
        if self._cpu and cpu is None:
            log.info("no CPU metrics: /proc is not available on this system")
        gpu = open_gpu_reader() if self._gpu else None
        if cpu is None and gpu is None:
            return  # nothing to sample: scrapes show no CPU or GPU gauges
        try:
            while True:
                try:
                    self.latest = Usage(
                        cpu=cpu.read() if cpu else None, gpus=gpu.read() if gpu else ()
                    )
                except Exception:  # a failed sample must not end the sampling for good
                    log.exception("sampling CPU/GPU usage failed; keeping the last sample")
                if self._stop.wait(self._interval_s):
                    return
        finally:
            if gpu is not None:
                gpu.close()
