"""Phase 1, placement: where reposerve puts the instances of a model, and what it gives back.

Everywhere: the NVML probe reposerve runs agrees with nvidia-smi, and a model without
``[[instance_group]]`` resolves as Triton resolves it. On a GPU: instances of ``kind = "gpu"``
groups (``count = 2`` on every GPU, a ``gpus`` subset, the default) see the GPU nvidia-smi
names, by UUID, and hold contexts nvidia-smi lists; a model holding 4 GiB gives the memory
back on unload.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgspec

from tools.bench.servers import ROOT
from tools.gpu_check.context import Run, Server, explicit
from tools.gpu_check.models import PROBE, PROBE_CONFIG, groups, instance_facts, write_model
from tools.gpu_check.node import compute_apps, memory_used_mib, process_gone, torch_uuid
from tools.gpu_check.report import Phase


def placement(run: Run, phase: Phase) -> None:
    node = run.node
    if run.gpu_unusable(phase, "gpu placement"):
        return
    root = run.repository("placement")
    default = write_model(root, "default", PROBE_CONFIG, PROBE)
    on_gpu = run.gpu_ready(phase, "gpu placement")
    if on_gpu:
        count = len(node.gpus)
        last = count - 1  # a subset that is not device 0 where there are several
        memory = node.gpus[0].memory_total_mib / 1024
        hold_gib = round(min(4.0, memory / 4), 2)
        spread = write_model(root, "spread", PROBE_CONFIG + groups("gpu", 2), PROBE)
        subset = write_model(root, "subset", PROBE_CONFIG + groups("gpu", 2, [last]), PROBE)
        write_model(
            root,
            "hog",
            PROBE_CONFIG + groups("gpu", 1, [0]) + f"[parameters]\nhold_gib = {hold_gib}\n",
            PROBE,
        )
    server = run.serve(
        "placement", root, *explicit("default", *(["spread", "subset"] if on_gpu else []))
    )

    # The NVML probe reposerve runs (no CUDA in the front) must agree with nvidia-smi.
    probe = subprocess.run(
        [sys.executable, "-I", str(ROOT / "reposerve" / "repository" / "nvml.py")],
        capture_output=True,
        timeout=60,
    )
    probed = msgspec.json.decode(probe.stdout or b"[]") if probe.returncode == 0 else None
    probed_uuids = sorted(gpu["uuid"] for gpu in probed or [])
    phase.facts["nvml_probe"] = probed
    phase.check(
        "the NVML probe lists the GPUs nvidia-smi lists",
        probed is not None and probed_uuids == sorted(gpu.uuid for gpu in node.all_gpus),
        f"probe: {probed_uuids} (exit {probe.returncode}, {probe.stderr.decode()[-300:]!r}); "
        f"nvidia-smi: {[gpu.uuid for gpu in node.all_gpus]}",
    )

    # No [[instance_group]]: one instance per visible GPU, else one on the CPU (Triton's rule).
    resolved = server.http.get("/v2/models/default/config").json()["instance_group"]
    expected = (
        [{"kind": "KIND_GPU", "count": 1, "gpus": list(range(len(node.gpus)))}]
        if on_gpu
        else [{"kind": "KIND_CPU", "count": 1, "gpus": []}]
    )
    shown = [{key: group[key] for key in ("kind", "count", "gpus")} for group in resolved]
    phase.facts["default_instance_group"] = shown
    phase.check("no instance_group resolves as in Triton", shown == expected, f"{shown}")
    found = instance_facts(default)
    phase.facts["default_instances"] = found
    wanted_devices = ["cuda:0"] * len(node.gpus) if on_gpu else ["cpu"]
    phase.check(
        "default instances run where the config says",
        sorted(fact["device"] for fact in found) == wanted_devices,
        f"{[fact['device'] for fact in found]}",
    )
    answer = server.infer_flag("default", 0)
    served = (
        msgspec.json.decode(answer.json()["outputs"][0]["data"][0])
        if answer.status_code == 200
        else {}
    )
    phase.check(
        "a request reaches one of those instances",
        served.get("pid") in {fact["pid"] for fact in found},
        f"HTTP {answer.status_code}: {served or answer.text[:300]}",
    )
    if not on_gpu:
        phase.skipped = f"{node.no_gpu_reason}; ran the CPU part only"
        phase.headline = f"CPU part: default model -> {shown[0]['kind']}, probe {probed_uuids}"
        return
    _gpu_placement(run, phase, server, root, spread, subset, default, hold_gib)


def _gpu_placement(
    run: Run,
    phase: Phase,
    server: Server,
    root: Path,
    spread: Path,
    subset: Path,
    default: Path,
    hold_gib: float,
) -> None:
    gpus = run.node.gpus
    uuids = [gpu.uuid for gpu in gpus]
    for label, version, per_gpu, devices in (
        ("spread (count 2 on every GPU)", spread, 2, uuids),
        (f"subset (gpus = [{len(gpus) - 1}])", subset, 2, uuids[-1:]),
        ("default (one per GPU)", default, 1, uuids),
    ):
        found = instance_facts(version)
        phase.facts[f"instances: {label}"] = found
        seen = Counter(torch_uuid(fact.get("uuid", "?")).lower() for fact in found)
        phase.check(
            f"{label}: torch's device UUID is the GPU nvidia-smi names",
            seen == Counter({uuid.lower(): per_gpu for uuid in devices}),
            f"instances on {dict(seen)}; expected {per_gpu} on each of {devices}",
        )
        phase.check(
            f"{label}: CUDA_VISIBLE_DEVICES is that UUID, one device visible",
            all(
                (fact["cuda_visible_devices"] or "").lower() == torch_uuid(fact["uuid"]).lower()
                and fact["device_count"] == 1
                for fact in found
            ),
            f"{[(fact['cuda_visible_devices'], fact.get('device_count')) for fact in found]}",
        )

    # Each instance holds a context, so nvidia-smi lists its pid on its GPU; inside a
    # container nvidia-smi may show the host's pids (or none): then this cannot be verified.
    instances = {
        fact["pid"]: torch_uuid(fact["uuid"]).lower()
        for version in (spread, subset, default)
        for fact in instance_facts(version)
    }
    apps = compute_apps()
    phase.facts["nvidia_smi_compute_apps"] = apps
    listed = {pid: uuid.lower() for pid, uuid, _ in apps}
    matched = {pid for pid in instances if pid in listed}
    if matched:
        phase.check(
            "nvidia-smi lists every instance pid on its own GPU",
            matched == set(instances) and all(listed[pid] == instances[pid] for pid in matched),
            f"{len(matched)} of {len(instances)} instance pids listed; nvidia-smi: {apps}",
        )
    else:
        phase.check(
            "nvidia-smi lists the instance pids",
            True,
            f"not verifiable: none of the {len(instances)} instance pids is among nvidia-smi's "
            f"{apps} (another PID namespace, as in a container)",
        )

    # A model holding device memory gives it back when unloaded.
    gpu0 = uuids[0]
    before = memory_used_mib(gpu0)
    loaded = server.http.post("/v2/repository/models/hog/load")
    phase.check("hog loads", loaded.status_code == 200, loaded.text[:300])
    server.wait_model_ready("hog")
    held = memory_used_mib(gpu0)
    phase.check(
        f"hog holds {hold_gib:g} GiB on GPU 0",
        held - before >= hold_gib * 1024 * 0.9,
        f"memory.used {before} -> {held} MiB",
    )
    hog_pids = [fact["pid"] for fact in instance_facts(root / "hog" / "1")]
    # What the memory budgets measure: NVML's per-process memory, as /stats reports it.
    stats = server.http.get("/v2/models/hog/stats").json()["model_stats"][0]
    on_gpu0 = [u for u in stats.get("memory_usage", []) if u["type"] == "GPU" and u["id"] == 0]
    phase.facts["hog_memory_usage"] = stats.get("memory_usage")
    phase.check(
        f"/stats memory_usage shows hog's {hold_gib:g} GiB on GPU 0 (NVML, by pid)",
        bool(on_gpu0) and on_gpu0[0]["byte_size"] >= hold_gib * (1 << 30) * 0.9,
        f"{stats.get('memory_usage')}",
    )
    unloaded_at = time.monotonic()
    unloaded = server.http.post("/v2/repository/models/hog/unload")
    phase.check("hog unloads", unloaded.status_code == 200, unloaded.text[:300])
    after = memory_used_mib(gpu0)
    while after > before + 256 and time.monotonic() - unloaded_at < 30:
        time.sleep(0.2)
        after = memory_used_mib(gpu0)
    returned_s = round(time.monotonic() - unloaded_at, 2)
    phase.facts["hog_memory_mib"] = {"before": before, "loaded": held, "after_unload": after}
    phase.check(
        "unload returns the memory (within 256 MiB)",
        after <= before + 256,
        f"memory.used {before} -> {held} -> {after} MiB, {returned_s} s after the unload call",
    )
    phase.check("hog's instance is gone", all(process_gone(pid) for pid in hog_pids), f"{hog_pids}")
    phase.headline = (
        f"{len(instances)} instances on {len(gpus)} GPU(s) match nvidia-smi's UUIDs; "
        f"unload returned {(held - after) / 1024:.1f} GiB in {returned_s} s"
    )
