"""GPU discovery: CUDA_VISIBLE_DEVICES applied with CUDA's rules to a fake probe's list, the
probe command seam, and the NVML probe itself against a fake libnvidia-ml."""

from __future__ import annotations

import logging
import shlex
import shutil
import subprocess
import sys
import textwrap

import msgspec
import pytest

from reposerve.repository import gpus, nvml
from reposerve.repository.gpus import Device, visible
from reposerve.repository.nvml import Gpu, MigDevice

A = "GPU-aaaa1111-0000-0000-0000-000000000000"
B = "GPU-aaaa2222-0000-0000-0000-000000000000"
C = "GPU-cccc3333-0000-0000-0000-000000000000"
MIG = [MigDevice("MIG-dddd0001", "H200 MIG 3g.71gb", 71), MigDevice("MIG-dddd0002", "mig", 70)]
NODE = [
    Gpu(0, A, "H200", 141),
    Gpu(1, B, "H200", 141),
    Gpu(2, C, "H200", 141, mig_enabled=True, mig_devices=MIG),
    Gpu(3, "GPU-eeee", "H200", 141, mig_enabled=True),  # MIG on, no MIG device made yet
]


def _uuids(setting: str | None) -> list[str]:
    return [device.uuid for device in visible(NODE, setting)]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (None, [A, B, "MIG-dddd0001", "MIG-dddd0002"]),  # a MIG GPU stands for its MIG devices
        ("", []),
        (" ", []),
        ("1,0", [B, A]),
        (" 1 , 0 ", [B, A]),
        (A, [A]),
        (f"{B},GPU-aaaa1", [B, A]),  # a unique prefix will do
        ("MIG-dddd0002,0", ["MIG-dddd0002", A]),
        ("2", ["MIG-dddd0001", "MIG-dddd0002"]),
    ],
)
def test_visible_devices_follow_cuda_visible_devices(setting, expected):
    assert _uuids(setting) == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    ("setting", "expected", "entry", "why"),
    [
        ("0,1,-1,2", [A, B], "-1", "is neither a GPU index nor a GPU-/MIG- UUID"),
        ("1,7,0", [B], "7", "is not a GPU index (the node has 4 GPUs)"),
        ("0,GPU-ffff,1", [A], "GPU-ffff", "matches no device"),
        ("1,GPU-aaaa,0", [B], "GPU-aaaa", "is a prefix of 2 devices' UUIDs"),
        ("MIG-dddd", [], "MIG-dddd", "is a prefix of 2 devices' UUIDs"),
        ("0,1,0", [A, B], "0", "names a device listed before it"),
        ("MIG-dddd0001,2", ["MIG-dddd0001"], "2", "names a device listed before it"),
        ("0,,1", [A], "", "is neither a GPU index nor a GPU-/MIG- UUID"),
    ],
)
def test_an_invalid_entry_ends_the_list_with_a_warning(setting, expected, entry, why, caplog):
    with caplog.at_level(logging.WARNING, logger="reposerve.repository"):
        assert _uuids(setting) == expected
    assert caplog.messages == [
        f"CUDA_VISIBLE_DEVICES={setting!r}: entry {entry!r} {why}; CUDA stops there and sees "
        f"only the {len(expected)} device(s) before it"
    ]


@pytest.mark.unit
def test_visible_devices_carry_name_memory_and_their_gpu():
    assert visible(NODE, "MIG-dddd0001,1") == [
        Device("MIG-dddd0001", "H200 MIG 3g.71gb", 71, gpu=2),
        Device(B, "H200", 141, gpu=1),
    ]


@pytest.mark.integration
def test_the_probe_command_can_be_replaced(monkeypatch, tmp_path):
    listing = tmp_path / "gpus.json"
    listing.write_bytes(msgspec.json.encode(NODE))
    monkeypatch.setenv(gpus.PROBE_VARIABLE, shlex.join(["cat", str(listing)]))
    assert gpus.probe(timeout=5) == NODE


@pytest.mark.integration
@pytest.mark.parametrize(
    ("command", "logged"),
    [
        ([sys.executable, "-c", "import sys; sys.exit('no driver')"], "failed (exit 1): no driver"),
        ([sys.executable, "-c", "print('[{}]')"], "printed no list of GPUs"),
        (["/nonexistent/probe"], "could not start"),
        ([sys.executable, "-c", "import time; time.sleep(60)"], "gave no answer within 1 s"),
    ],
)
def test_a_probe_that_fails_or_hangs_means_no_gpu(command, logged, monkeypatch, caplog):
    monkeypatch.setenv(gpus.PROBE_VARIABLE, shlex.join(command))
    with caplog.at_level(logging.ERROR, logger="reposerve.repository"):
        assert gpus.probe(timeout=1) == []
    assert logged in caplog.text and "no GPU will be used" in caplog.text


def _run_probe(library_dir, *arguments: str, **env: str) -> subprocess.CompletedProcess:
    """The NVML probe as the front runs it, finding libnvidia-ml.so.1 in ``library_dir``."""
    environment = {"LD_LIBRARY_PATH": str(library_dir), **env}
    return subprocess.run(
        [sys.executable, "-I", nvml.__file__, *arguments],
        capture_output=True,
        env=environment,
        timeout=60,
    )


@pytest.mark.integration
def test_without_nvml_the_probe_lists_no_gpu(tmp_path):
    library = tmp_path / "libnvidia-ml.so.1"
    library.write_bytes(b"not a library")  # found first, and fails to load like a missing one
    done = _run_probe(tmp_path)
    assert (done.returncode, done.stdout) == (0, b"[]")


# Two GPUs: GPU 0 without MIG support; GPU 1 in MIG mode with 3 slots, of which 0 and 2 hold
# MIG devices. Handles are small numbers; text buffers shorter than NVML's 96 bytes fail.
FAKE_NVML = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct { unsigned long long total, free, used; } memory_t;
static int id(void *handle) { return (int)(uintptr_t)handle; }

int nvmlInit_v2(void) { const char *code = getenv("FAKE_NVML_INIT"); return code ? atoi(code) : 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int code) { return code == 2 ? "Invalid Argument" : "Unknown Error"; }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    if (index > 1) return 2;
    *handle = (void *)(uintptr_t)(index + 1);
    return 0;
}
int nvmlDeviceGetUUID(void *handle, char *text, unsigned int length) {
    if (length < 96) return 7;
    snprintf(text, length, id(handle) < 100 ? "GPU-%d-fake" : "MIG-%d-fake", id(handle));
    return 0;
}
int nvmlDeviceGetName(void *handle, char *text, unsigned int length) {
    if (length < 96) return 7;
    snprintf(text, length, "Fake %d", id(handle));
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *handle, memory_t *memory) {
    memory->total = (unsigned long long)id(handle) << 32;
    memory->free = 1;
    memory->used = 2;
    return 0;
}
int nvmlDeviceGetMigMode(void *handle, unsigned int *current, unsigned int *pending) {
    if (id(handle) == 1) return 3;
    *current = 1;
    *pending = 0;
    return 0;
}
int nvmlDeviceGetMaxMigDeviceCount(void *handle, unsigned int *count) {
    *count = id(handle) == 2 ? 3 : 0;
    return 0;
}
int nvmlDeviceGetMigDeviceHandleByIndex(void *handle, unsigned int index, void **mig) {
    if (index == 1) return 6;
    *mig = (void *)(uintptr_t)(100 + index);
    return 0;
}
/* GPU 0 runs pids 41 (1 GiB) and 42 (3 MiB); GPU 1 runs 43, its memory not available. */
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } process_t;
int nvmlDeviceGetComputeRunningProcesses_v2(void *handle, unsigned int *count, process_t *out) {
    unsigned int needed = id(handle) == 1 ? 2 : 1;
    if (*count < needed) { *count = needed; return 7; }
    *count = needed;
    if (id(handle) == 1) {
        out[0] = (process_t){41, 1ULL << 30, 0, 0};
        out[1] = (process_t){42, 3ULL << 20, 0, 0};
    } else {
        out[0] = (process_t){43, ~0ULL, 0, 0};
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory):
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build a fake libnvidia-ml")
    folder = tmp_path_factory.mktemp("nvml")
    (folder / "nvml.c").write_text(textwrap.dedent(FAKE_NVML))
    output = folder / "libnvidia-ml.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", output, folder / "nvml.c"], check=True)
    return folder


@pytest.mark.integration
def test_the_probe_lists_gpus_and_mig_devices_through_nvml(fake_nvml):
    done = _run_probe(fake_nvml)
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout, type=list[Gpu]) == [
        Gpu(0, "GPU-1-fake", "Fake 1", 1 << 32),
        Gpu(
            1,
            "GPU-2-fake",
            "Fake 2",
            2 << 32,
            mig_enabled=True,
            mig_devices=[
                MigDevice("MIG-100-fake", "Fake 100", 100 << 32),
                MigDevice("MIG-102-fake", "Fake 102", 102 << 32),
            ],
        ),
    ]


@pytest.mark.integration
def test_nvml_without_a_driver_is_no_gpu_and_other_errors_fail_the_probe(fake_nvml):
    no_driver = _run_probe(fake_nvml, FAKE_NVML_INIT="9")
    assert (no_driver.returncode, no_driver.stdout) == (0, b"[]")
    broken = _run_probe(fake_nvml, FAKE_NVML_INIT="2")
    assert broken.returncode == 1
    assert broken.stderr == b"GPU probe: nvmlInit_v2 failed: Invalid Argument (NVML error 2)\n"


@pytest.mark.integration
def test_the_probe_lists_each_process_gpu_memory_through_nvml(fake_nvml, monkeypatch):
    done = _run_probe(fake_nvml, "processes")
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout, type=list[nvml.ProcessMemory]) == [
        nvml.ProcessMemory(gpu=0, pid=41, memory=1 << 30),
        nvml.ProcessMemory(gpu=0, pid=42, memory=3 << 20),
        nvml.ProcessMemory(gpu=1, pid=43, memory=0),  # not available reads as nothing held
    ]
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_nvml))
    monkeypatch.delenv(gpus.PROBE_VARIABLE, raising=False)
    assert gpus.process_memory(timeout=30) == {41: {0: 1 << 30}, 42: {0: 3 << 20}, 43: {1: 0}}
