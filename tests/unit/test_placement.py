"""Instance placement: instance groups -> one process spec per (group, device, count), with
Triton's defaults, devices by UUID, thread budgets and CPU pinning."""

from __future__ import annotations

from pathlib import Path

import pytest

from reposerve.config import InstanceGroup, parse_model_config
from reposerve.errors import ConfigError
from reposerve.repository import placement
from reposerve.repository.gpus import Gpus, visible
from reposerve.repository.nvml import Gpu, MigDevice

pytestmark = pytest.mark.unit


def _node(count: int, setting: str | None = None) -> Gpus:
    found = [Gpu(index, f"GPU-{index}{index}{index}", "H200", 141 << 30) for index in range(count)]
    return Gpus(tuple(found), setting, tuple(visible(found, setting)))


def _specs(groups: str, gpus: Gpus, monkeypatch, parameters: str = "", cores=range(8)):
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: set(cores))
    config = parse_model_config(groups + parameters, "m/config.toml")
    return placement.plan_instances("m", 1, Path("/m/1"), "python", config, gpus)


def _plan(groups: str, gpus: Gpus, monkeypatch, parameters: str = ""):
    specs = _specs(groups, gpus, monkeypatch, parameters).specs
    return [(spec.kind, spec.gpu and spec.gpu.uuid, spec.threads) for spec in specs]


def test_gpu_groups_place_count_instances_on_each_listed_gpu(monkeypatch):
    groups = '[[instance_group]]\nkind = "gpu"\ncount = 2\ngpus = [0, 2]\n'
    assert _plan(groups, _node(3), monkeypatch) == [
        ("gpu", "GPU-000", 2), ("gpu", "GPU-000", 2), ("gpu", "GPU-222", 2), ("gpu", "GPU-222", 2),
    ]  # fmt: skip


def test_gpu_group_without_list_uses_every_visible_gpu(monkeypatch):
    groups = '[[instance_group]]\nkind = "gpu"\n'
    specs = _specs(groups, _node(2), monkeypatch).specs
    assert [(spec.gpu.index, spec.gpu.uuid) for spec in specs] == [(0, "GPU-000"), (1, "GPU-111")]
    assert specs[1].label == "model 'm' version 1 instance 1 (gpu 1 GPU-111)"


def test_auto_picks_the_gpu_when_there_is_one_and_the_cpu_otherwise(monkeypatch):
    groups = '[[instance_group]]\nkind = "auto"\n'
    assert _plan(groups, _node(1), monkeypatch) == [("gpu", "GPU-000", 2)]
    assert _plan(groups, _node(0), monkeypatch) == [("cpu", None, 8)]


def test_no_instance_group_is_one_instance_per_gpu_else_one_on_the_cpu(monkeypatch):
    on_gpus = _specs("", _node(2), monkeypatch)
    assert [(s.kind, s.gpu.uuid) for s in on_gpus.specs] == [("gpu", "GPU-000"), ("gpu", "GPU-111")]
    assert on_gpus.config.instance_group == [InstanceGroup(kind="gpu", count=1, gpus=[0, 1])]
    on_cpu = _specs("", _node(0), monkeypatch)
    assert _plan("", _node(0), monkeypatch) == [("cpu", None, 8)]
    assert on_cpu.config.instance_group == [InstanceGroup(kind="cpu", count=1)]
    # CUDA_VISIBLE_DEVICES="" hides the node's GPUs: the CPU, as CUDA would run it.
    assert _plan("", _node(2, setting=""), monkeypatch) == [("cpu", None, 8)]


def test_the_config_shows_the_groups_as_resolved(monkeypatch):
    groups = '[[instance_group]]\nkind = "auto"\ngpus = [1]\n[[instance_group]]\nkind = "gpu"\n'
    resolved = _specs(groups, _node(2), monkeypatch).config.instance_group
    assert resolved == [InstanceGroup(kind="gpu", gpus=[1]), InstanceGroup(kind="gpu", gpus=[0, 1])]
    fallback = _specs('[[instance_group]]\nkind = "auto"\ngpus = [1]\n', _node(0), monkeypatch)
    assert fallback.config.instance_group == [InstanceGroup(kind="cpu")]
    # Every instance is handed the resolved config, so its completed copy shows them too.
    assert b'"kind":"cpu"' in fallback.specs[0].config_json


def test_cpu_instances_split_the_cores_and_gpu_instances_get_a_few(monkeypatch):
    groups = '[[instance_group]]\ncount = 3\n[[instance_group]]\nkind = "gpu"\ncount = 16\n'
    plan = _plan(groups, _node(1), monkeypatch)
    assert plan[:3] == [("cpu", None, 2)] * 3  # 8 cores // 3
    assert plan[3:] == [("gpu", "GPU-000", 2)] * 16  # not 16 x 8 threads on 8 cores
    pinned = _plan(groups, _node(1), monkeypatch, "[parameters]\nintra_op_threads = 4")
    assert {threads for _, _, threads in pinned} == {4}


def test_pinned_groups_get_their_cores_and_threads_to_match(monkeypatch):
    groups = (
        "[[instance_group]]\ncount = 2\ncpus = [4, 5, 6, 7]\n"  # 2 instances share 4 cores
        "[[instance_group]]\ncount = 3\n"  # the unpinned split all 8
        '[[instance_group]]\nkind = "gpu"\ncpus = [3]\n'
    )
    specs = _specs(groups, _node(1), monkeypatch).specs
    assert [(spec.cpus, spec.threads) for spec in specs] == [
        ((4, 5, 6, 7), 2), ((4, 5, 6, 7), 2), ((), 2), ((), 2), ((), 2), ((3,), 1),
    ]  # fmt: skip


def test_mig_devices_are_placed_by_their_own_uuid(monkeypatch):
    mig = [MigDevice("MIG-a", "H200 MIG 3g.71gb", 71 << 30), MigDevice("MIG-b", "H200 MIG", 1)]
    found = [Gpu(0, "GPU-000", "H200", 141 << 30, mig_enabled=True, mig_devices=mig)]
    gpus = Gpus(tuple(found), None, tuple(visible(found, None)))
    assert _plan("", gpus, monkeypatch) == [("gpu", "MIG-a", 2), ("gpu", "MIG-b", 2)]


def test_gpu_numbers_follow_the_servers_own_cuda_visible_devices(monkeypatch):
    # The server runs with CUDA_VISIBLE_DEVICES=3,1: its device 0 is the node's GPU 3.
    groups = '[[instance_group]]\nkind = "gpu"\ngpus = [1, 0]\n'
    plan = _plan(groups, _node(4, setting="3,1"), monkeypatch)
    assert [uuid for _, uuid, _ in plan] == ["GPU-111", "GPU-333"]


@pytest.mark.parametrize(
    ("groups", "gpus", "message"),
    [
        (
            '[[instance_group]]\nkind = "gpu"\n',
            _node(0),
            "model 'm': instance_group[0] asks for kind \"gpu\" but no GPU is visible (this "
            "server sees no GPU; the node has 0; CUDA_VISIBLE_DEVICES is unset). "
            'Hint: use kind = "auto" to fall back to the CPU',
        ),
        (
            '[[instance_group]]\ncount = 2\n[[instance_group]]\nkind = "gpu"\n',
            _node(2, setting="7"),
            "model 'm': instance_group[1] asks for kind \"gpu\" but no GPU is visible (this "
            "server sees no GPU; the node has 2; CUDA_VISIBLE_DEVICES is '7'). "
            'Hint: use kind = "auto" to fall back to the CPU',
        ),
        (
            '[[instance_group]]\nkind = "gpu"\ngpus = [3]\n',
            _node(2),
            "model 'm': instance_group[0].gpus: GPU(s) [3] not visible (this server sees 2: "
            "0 = GPU-000 (H200), 1 = GPU-111 (H200); the node has 2; CUDA_VISIBLE_DEVICES is "
            "unset)",
        ),
        (
            "[[instance_group]]\n[[instance_group]]\ncpus = [2, 9, 4]\n",
            _node(0),
            "model 'm': instance_group[1].cpus: core(s) [4, 9] not available (this server may "
            "use 0-3,5-7). Hint: see `nproc` and the container's cpuset",
        ),
    ],
)
def test_impossible_placements_are_load_errors_naming_the_model(groups, gpus, message, monkeypatch):
    with pytest.raises(ConfigError) as caught:
        _specs(groups, gpus, monkeypatch, cores=[0, 1, 2, 3, 5, 6, 7])
    assert caught.value.message == message


def test_kind_model_runs_on_the_host_with_no_gpu_assigned(monkeypatch):
    """Triton's KIND_MODEL: the model picks its device; reposerve gives it none."""
    groups = '[[instance_group]]\nkind = "model"\ncount = 2\n'
    assert _plan(groups, _node(2), monkeypatch) == [("model", None, 4), ("model", None, 4)]
