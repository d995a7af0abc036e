"""Instance placement: instance groups -> one process spec per (group, device, count)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reposerve.config import parse_model_config
from reposerve.errors import ConfigError
from reposerve.repository import placement

pytestmark = pytest.mark.unit


def _plan(groups: str, gpus: list[int], monkeypatch, parameters: str = ""):
    monkeypatch.setattr(placement, "visible_gpus", lambda: gpus)
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: set(range(8)))
    config = parse_model_config(groups + parameters, "m/config.toml")
    specs = placement.plan_instances("m", 1, Path("/m/1"), "python", config)
    return [(spec.kind, spec.gpu, spec.threads) for spec in specs]


def test_gpu_groups_place_count_instances_on_each_listed_gpu(monkeypatch):
    groups = '[[instance_group]]\nkind = "gpu"\ncount = 2\ngpus = [0, 2]\n'
    assert _plan(groups, [0, 1, 2], monkeypatch) == [
        ("gpu", 0, 2), ("gpu", 0, 2), ("gpu", 2, 2), ("gpu", 2, 2),
    ]  # fmt: skip


def test_gpu_group_without_list_uses_every_visible_gpu(monkeypatch):
    groups = '[[instance_group]]\nkind = "gpu"\n'
    assert [gpu for _, gpu, _ in _plan(groups, [0, 1], monkeypatch)] == [0, 1]


def test_auto_picks_the_gpu_when_there_is_one_and_the_cpu_otherwise(monkeypatch):
    groups = '[[instance_group]]\nkind = "auto"\n'
    assert _plan(groups, [0], monkeypatch) == [("gpu", 0, 2)]
    assert _plan(groups, [], monkeypatch) == [("cpu", None, 8)]


def test_cpu_instances_split_the_cores_and_gpu_instances_get_a_few(monkeypatch):
    groups = '[[instance_group]]\ncount = 3\n[[instance_group]]\nkind = "gpu"\ncount = 16\n'
    plan = _plan(groups, [0], monkeypatch)
    assert plan[:3] == [("cpu", None, 2)] * 3  # 8 cores // 3
    assert plan[3:] == [("gpu", 0, 2)] * 16  # not 16 x 8 threads on 8 cores
    pinned = _plan(groups, [0], monkeypatch, "[parameters]\nintra_op_threads = 4")
    assert {threads for _, _, threads in pinned} == {4}


@pytest.mark.parametrize(
    ("groups", "gpus", "message"),
    [
        ('[[instance_group]]\nkind = "gpu"\n', [], 'asks for kind "gpu" but no GPU is visible'),
        (
            '[[instance_group]]\nkind = "gpu"\ngpus = [3]\n',
            [0, 1],
            "instance_group[0].gpus: GPU(s) [3] not visible (this server sees 2: 0..1)",
        ),
    ],
)
def test_impossible_placements_are_load_errors_naming_the_model(groups, gpus, message, monkeypatch):
    with pytest.raises(ConfigError, match="model 'm'") as caught:
        _plan(groups, gpus, monkeypatch)
    assert message in caught.value.message


def test_visible_gpus_honours_cuda_visible_devices(monkeypatch, tmp_path):
    for index in range(4):
        (tmp_path / f"0000:0{index}:00.0").mkdir()
    monkeypatch.setattr(placement, "_NVIDIA_GPUS", tmp_path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert placement.visible_gpus() == [0, 1, 2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert placement.visible_gpus() == [2, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert placement.visible_gpus() == []


def test_gpu_numbers_follow_the_servers_own_cuda_visible_devices(monkeypatch):
    # The server runs with CUDA_VISIBLE_DEVICES=3,1: its device 0 is the driver's GPU 3.
    groups = '[[instance_group]]\nkind = "gpu"\ngpus = [1, 0]\n'
    assert [gpu for _, gpu, _ in _plan(groups, [3, 1], monkeypatch)] == [1, 3]
