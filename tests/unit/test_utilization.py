"""CPU usage from /proc and GPU usage from NVML, mapped onto Triton's gauges."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reposerve.metrics import render
from reposerve.utilization import CpuReader, CpuUsage, GpuReader, GpuUsage, Usage, open_gpu_reader

pytestmark = pytest.mark.unit

MEMINFO = "MemTotal:       16000000 kB\nMemFree:  1000 kB\nMemAvailable:    4000000 kB\n"


def _proc(folder: Path, user: int, idle: int) -> Path:
    # user nice system idle iowait irq softirq steal guest guest_nice
    (folder / "stat").write_text(
        f"cpu  {user} 0 100 {idle} 50 0 0 0 999 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
    )
    (folder / "meminfo").write_text(MEMINFO)
    return folder


def test_cpu_utilisation_is_the_busy_share_since_the_last_sample(tmp_path):
    reader = CpuReader(_proc(tmp_path, user=1000, idle=8000))
    first = reader.read()
    assert first == CpuUsage(0.0, 16_000_000 * 1024, 12_000_000 * 1024)
    _proc(tmp_path, user=1300, idle=8100)  # 300 busy, 100 idle jiffies since; guest ignored
    assert reader.read().utilization == pytest.approx(0.75)
    _proc(tmp_path, user=1300, idle=8500)
    assert reader.read().utilization == 0.0


def test_cpu_usage_of_this_machine_is_sane():
    usage = CpuReader().read()
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    assert usage.memory_total == int(meminfo["MemTotal"].split()[0]) * 1024
    assert 0 < usage.memory_used < usage.memory_total


class _NotSupported(Exception):
    pass


def _fake_nvml() -> tuple[types.ModuleType, dict]:
    """nvidia-ml-py's calls the reader makes, over two GPUs; the second reports no power.
    Only for the mapping: no GPU can run here."""
    state = {"energy": [1_000_000, 5_000], "closed": False}
    nvml = types.ModuleType("fake_pynvml")
    nvml.NVMLError_NotSupported = _NotSupported
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: state.update(closed=True)
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda index: index
    nvml.nvmlDeviceGetUUID = lambda h: [b"GPU-aaaa", "GPU-bbbb"][h]  # old pynvml: bytes
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=[73, 0][h], memory=5)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=[80 << 30, 24 << 30][h], used=[3 << 30, 0][h], free=0
    )

    def power(h):
        if h == 1:
            raise _NotSupported
        return 215_500  # mW

    def limit(h):
        if h == 1:
            raise _NotSupported
        return 700_000

    nvml.nvmlDeviceGetPowerUsage = power
    nvml.nvmlDeviceGetEnforcedPowerLimit = limit
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda h: state["energy"][h]  # mJ
    return nvml, state


def test_nvml_readings_map_onto_tritons_units():
    nvml, state = _fake_nvml()
    reader = GpuReader(nvml)
    state["energy"] = [1_250_000, 5_000]
    assert reader.read() == (
        GpuUsage("GPU-aaaa", 0.73, 80 << 30, 3 << 30, 215.5, 700.0, 250.0),
        GpuUsage("GPU-bbbb", 0.0, 24 << 30, 0, None, None, 0.0),
    )
    reader.close()
    assert state["closed"]


def test_gpu_and_cpu_gauges_in_the_exposition():
    nvml, _ = _fake_nvml()
    usage = Usage(cpu=CpuUsage(0.5, 100, 40), gpus=GpuReader(nvml).read())
    samples = {
        (sample.name, sample.labels.get("gpu_uuid")): sample.value
        for family in text_string_to_metric_families(render([], usage=usage).decode())
        for sample in family.samples
    }
    assert samples == {
        ("nv_cpu_utilization", None): 0.5,
        ("nv_cpu_memory_total_bytes", None): 100,
        ("nv_cpu_memory_used_bytes", None): 40,
        ("nv_gpu_utilization", "GPU-aaaa"): 0.73,
        ("nv_gpu_utilization", "GPU-bbbb"): 0.0,
        ("nv_gpu_memory_total_bytes", "GPU-aaaa"): 80 << 30,
        ("nv_gpu_memory_total_bytes", "GPU-bbbb"): 24 << 30,
        ("nv_gpu_memory_used_bytes", "GPU-aaaa"): 3 << 30,
        ("nv_gpu_memory_used_bytes", "GPU-bbbb"): 0,
        ("nv_gpu_power_usage", "GPU-aaaa"): 215.5,
        ("nv_gpu_power_limit", "GPU-aaaa"): 700.0,
        ("nv_energy_consumption", "GPU-aaaa"): 0.0,
        ("nv_energy_consumption", "GPU-bbbb"): 0.0,
    }


def test_without_nvml_there_is_a_reason_in_the_log(caplog):
    caplog.set_level(logging.INFO, "reposerve.metrics")
    reader = open_gpu_reader()
    if reader is not None:  # a machine with NVML and a GPU
        assert reader.count > 0 and reader.read()[0].uuid.startswith(("GPU-", "MIG-"))
        reader.close()
    else:
        assert any(r.message.startswith("no GPU metrics: ") for r in caplog.records)
