"""GPU readiness check: placement, precision, throughput and faults on a real server.

    python -m tools.gpu_check [--out gpu-check] [--budget-s 480] [--seconds 8]
                              [--phases placement,precision,throughput,faults] [--cpu-smoke]

One prepared script for a session lent a GPU machine (issue 8): it starts real reposerve
servers on temporary repositories, calls them with tritonclient.http, httpx and the bench
load generator, and writes one JSON document per phase to ``--out`` (``<phase>.json``:
status passed | failed | skipped, the reason, every check, the measured facts, and on a
failure the traceback and the servers' log tails), then ``summary.json``, and prints one
line per phase. Exit status 0 when no phase failed.

1. placement: instances of ``kind = "gpu"`` groups (``count = 2`` on every GPU, and a
   ``gpus`` subset) report their ``CUDA_VISIBLE_DEVICES`` and torch's device UUID, which
   must be the GPU nvidia-smi names; their pids must hold contexts in nvidia-smi; a model
   holding 4 GiB gives the memory back on unload. The CPU part (the NVML probe agrees with
   nvidia-smi; no ``[[instance_group]]`` resolves as Triton does) runs everywhere.
2. precision: a ResNet-18 ``.pt2`` (weights=None) served at fp32, bf16 (and fp16 on a GPU)
   equals a direct run in this process under the same ``torch.autocast``, and bf16 differs
   from fp32.
3. throughput (GPU): ResNet-50 bf16 images/s through the server against pure torch on the
   same GPU, batch 16 and 32, one and two instances (goal: >= 0.9x), and the latency of the
   first 50 requests after a warmed-up load. ``--cpu-smoke`` runs a tiny CPU version.
4. faults: out of device memory fails one request and the same instance serves the next; a
   device-side assert fails its request with "being replaced" and 20 requests after it
   succeed; SIGKILL of an instance holding 20 GiB (CPU: 1.5 GiB of RAM) while
   ``/v2/health/live`` is polled every 10 ms. Only the SIGKILL part runs without a GPU.

Goals (throughput ratios, first-request latency) are reported with their checks but never
fail a phase; ``--budget-s`` bounds the whole run: a phase that would not fit is skipped,
and one that runs past the budget is stopped and failed, its servers stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import msgspec
import numpy as np

from tools.bench import loadgen
from tools.bench.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("placement", "precision", "throughput", "faults")
# About how long each phase needs on a GPU node; one that would not fit is skipped.
ESTIMATE_S = {"placement": 40.0, "precision": 45.0, "throughput": 150.0, "faults": 60.0}
Status = Literal["passed", "failed", "skipped"]


# -- the JSON documents ----------------------------------------------------------------------


class Check(msgspec.Struct):
    name: str
    ok: bool
    detail: str
    goal: bool = False  # a performance goal: reported, never fails the phase


class PhaseReport(msgspec.Struct):
    phase: str
    status: Status
    reason: str  # why it failed or was skipped; for a pass, the parts it skipped
    seconds: float
    headline: str  # the measured result in one line
    checks: list[Check]
    skipped_parts: dict[str, str]  # part -> why it did not run
    facts: dict[str, Any]
    error: str | None = None  # the traceback of an exception that stopped the phase
    server_logs: dict[str, str] = {}  # server label -> log tail, kept when the phase failed


class Gpu(msgspec.Struct, frozen=True):
    index: int  # nvidia-smi's (NVML's) index
    uuid: str
    name: str
    memory_total_mib: int


class PhaseLine(msgspec.Struct):
    phase: str
    status: Status
    seconds: float
    line: str


class Summary(msgspec.Struct):
    ok: bool  # no phase failed
    seconds: float
    budget_s: float
    python: str
    torch: str | None
    cuda_available: bool
    gpus: list[Gpu]  # the GPUs this run could use, in CUDA's order
    no_gpu_reason: str
    phases: list[PhaseLine]


_encode = msgspec.json.Encoder().encode


class BudgetExceeded(BaseException):
    """Raised by the timer in the main thread; a BaseException so that no ``except
    Exception`` on the way (HTTP retries, polling loops) swallows it."""


class Phase:
    """What one phase has found so far: its function fills it, ``report`` freezes it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.checks: list[Check] = []
        self.facts: dict[str, Any] = {}
        self.skipped_parts: dict[str, str] = {}
        self.skipped: str | None = None  # set when the phase's purpose could not run here
        self.headline = ""

    def check(self, name: str, ok: bool, detail: str = "", goal: bool = False) -> bool:
        self.checks.append(Check(name, bool(ok), detail, goal))
        return bool(ok)

    def skip_part(self, part: str, why: str) -> None:
        self.skipped_parts[part] = why

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        """Seconds ``step`` took, in the facts: where a phase spends the budget."""
        started = time.monotonic()
        try:
            yield
        finally:
            timings = self.facts.setdefault("timings_s", {})
            timings[step] = round(time.monotonic() - started, 2)

    def report(self, seconds: float, error: str | None, logs: dict[str, str]) -> PhaseReport:
        failed = [check for check in self.checks if not check.ok and not check.goal]
        if error is not None or failed:
            status: Status = "failed"
            reason = (
                error.strip().splitlines()[-1] if error else f"{failed[0].name}: {failed[0].detail}"
            )
        elif self.skipped is not None:
            status, reason = "skipped", self.skipped
        else:
            status = "passed"
            reason = "; ".join(f"{part} not run: {why}" for part, why in self.skipped_parts.items())
        return PhaseReport(
            self.name,
            status,
            reason,
            round(seconds, 1),
            self.headline,
            self.checks,
            self.skipped_parts,
            self.facts,
            error,
            logs if status == "failed" else {},
        )


# -- the node: GPUs as nvidia-smi lists them ------------------------------------------------


def _smi(*query: str) -> list[list[str]]:
    """Rows of an ``nvidia-smi --query-...`` in CSV without header or units."""
    done = subprocess.run(
        ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(query)}: exit {done.returncode}: {done.stderr}")
    return [
        [field.strip() for field in line.split(",")]
        for line in done.stdout.splitlines()
        if line.strip() and "," in line  # "No running processes found" has no comma
    ]


def find_gpus() -> tuple[list[Gpu], list[Gpu], str]:
    """The GPUs nvidia-smi lists; those this process's CUDA_VISIBLE_DEVICES leaves visible,
    in CUDA's order (reposerve's ``gpus = [N]`` counts the same way); why there are none."""
    if shutil.which("nvidia-smi") is None:
        return [], [], "no GPU: nvidia-smi is not on PATH"
    try:
        rows = _smi("--query-gpu=index,uuid,name,memory.total")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return [], [], f"no GPU: nvidia-smi failed ({exc})"
    found = [Gpu(int(row[0]), row[1], row[2], int(float(row[3]))) for row in rows]
    if not found:
        return [], [], "no GPU: nvidia-smi lists none"
    setting = os.environ.get("CUDA_VISIBLE_DEVICES")
    if setting is None:
        return found, found, ""
    visible: list[Gpu] = []
    # CUDA's rule, for the forms a session would set: indices or GPU- UUID prefixes; the
    # first entry that names nothing ends the list.
    for entry in (part.strip() for part in setting.split(",")):
        matches = [
            gpu
            for gpu in found
            if (entry.isdigit() and gpu.index == int(entry))
            or (entry.startswith("GPU-") and gpu.uuid.startswith(entry))
        ]
        if len(matches) != 1 or matches[0] in visible:
            break
        visible.append(matches[0])
    if not visible:
        why = f"no GPU: CUDA_VISIBLE_DEVICES={setting!r} leaves none of {len(found)} visible"
        return found, [], why
    return found, visible, ""


def memory_used_mib(uuid: str) -> int:
    rows = _smi("--query-gpu=uuid,memory.used")
    return next(int(float(row[1])) for row in rows if row[0] == uuid)


def compute_apps() -> list[tuple[int, str, int]]:
    """(pid, GPU UUID, used MiB) of every process nvidia-smi shows holding a context."""
    rows = _smi("--query-compute-apps=pid,gpu_uuid,used_memory")
    return [(int(row[0]), row[1], int(float(row[2] or 0))) for row in rows if row[0].isdigit()]


def torch_uuid(value: str) -> str:
    """torch prints a device UUID without nvidia-smi's ``GPU-`` prefix."""
    return value if value.startswith(("GPU-", "MIG-")) else f"GPU-{value}"


class Node:
    """What this machine offers: the GPUs, and whether this torch can use them."""

    def __init__(self) -> None:
        self.all_gpus, self.gpus, self.no_gpu_reason = find_gpus()
        try:
            import torch

            self.torch: str | None = str(torch.__version__)
            # Initialises the driver only: no context, no device memory taken.
            self.cuda = torch.cuda.is_available()
        except ImportError:
            self.torch, self.cuda = None, False

    def gpu_ready(self, phase: Phase, part: str) -> bool:
        """Whether ``part`` can run on a GPU; when not, the phase says why: skipped where
        there is no GPU, failed where there is one this torch cannot use (a setup fault the
        session must see, not a quiet skip)."""
        if not self.gpus:
            phase.skip_part(part, self.no_gpu_reason)
            return False
        if not self.cuda:
            phase.check(
                part,
                False,
                f"nvidia-smi lists {len(self.gpus)} GPU(s) but torch {self.torch} cannot use "
                "CUDA. Hint: install a CUDA build of torch in this environment",
            )
            return False
        return True


# -- servers and repositories ---------------------------------------------------------------


class Server:
    """A reposerve process on a free port, with its log in the output folder."""

    def __init__(self, label: str, repository: Path, flags: list[str], log_path: Path) -> None:
        self.label = label
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        environment.setdefault("REPOSERVE_CACHE_DIR", str(repository.parent / "cache"))
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "reposerve", "--model-repository", str(repository),
                "--http-host", "127.0.0.1", "--http-port", str(self.port),
                "--allow-metrics", "false", "--log-level", "warning",
                "--exit-timeout-secs", "5", *flags,
            ],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=environment,
        )  # fmt: skip
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds until ``/v2/health/ready`` answered 200."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.label} server exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                if self.http.get("/v2/health/ready", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.label} server not ready after {timeout:g} s")

    def wait_model_ready(self, model: str, timeout: float = 120.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.http.get(f"/v2/models/{model}/ready").status_code == 200:
                return time.monotonic() - started
            time.sleep(0.05)
        raise TimeoutError(f"{model} not ready after {timeout:g} s")

    def infer_flag(self, model: str, flag: int) -> httpx.Response:
        """One item ``[flag]`` (INT32) as JSON, for the small probe and fault models."""
        tensor = {"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [flag]}
        return self.http.post(f"/v2/models/{model}/infer", json={"inputs": [tensor]})

    def stats(self, model: str) -> tuple[int, int]:
        """(items, batches) the model has run."""
        document = self.http.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
        return document["inference_count"], document["execution_count"]

    def log_tail(self, size: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-size:]

    def stop(self) -> None:
        self.http.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class Run:
    """One run: the node, the options, the temporary folder and the servers to stop."""

    def __init__(self, args: argparse.Namespace, node: Node, workdir: Path) -> None:
        self.args = args
        self.node = node
        self.workdir = workdir
        self.servers: list[Server] = []

    def repository(self, name: str) -> Path:
        path = self.workdir / name / "repository"
        path.mkdir(parents=True)
        return path

    def serve(self, label: str, repository: Path, *flags: str) -> Server:
        server = Server(label, repository, list(flags), self.args.out / f"{label}.log")
        self.servers.append(server)  # before waiting: a server that never gets ready is stopped too
        server.wait_ready()
        return server

    def stop_servers(self) -> dict[str, str]:
        """Stop every server; returns their log tails."""
        tails = {}
        for server in self.servers:
            server.stop()
            tails[server.label] = server.log_tail()
        self.servers.clear()
        return tails


def write_model(root: Path, name: str, config: str, code: str | None = None) -> Path:
    """A model folder; returns its version folder (1/), where a model file goes."""
    version = root / name / "1"
    version.mkdir(parents=True)
    (root / name / "config.toml").write_text(textwrap.dedent(config))
    if code is not None:
        (version / "model.py").write_text(textwrap.dedent(code))
    return version


def instance_facts(version: Path) -> list[dict[str, Any]]:
    """What each instance of a PROBE or FAULTS model wrote at load, oldest first."""
    files = sorted((version / "instances").glob("*.json"), key=lambda path: path.stat().st_mtime)
    return [msgspec.json.decode(path.read_bytes()) for path in files]


def explicit(*models: str) -> list[str]:
    return ["--model-control-mode", "explicit", *(f"--load-model={model}" for model in models)]


def groups(kind: str, count: int = 1, gpus: list[int] | None = None) -> str:
    listed = f"\ngpus = {gpus}" if gpus is not None else ""
    return f'[[instance_group]]\nkind = "{kind}"\ncount = {count}{listed}\n'


def process_gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def percentile_ms(latencies: list[float], q: float) -> float:
    return round(float(np.percentile(np.array(latencies) * 1000, q)), 2) if latencies else 0.0


# -- the models ------------------------------------------------------------------------------

# Reports where it runs: at load into instances/<pid>.json beside model.py (so that every
# instance is seen, not just those requests reach), and in answer to a request as BYTES.
# ``[parameters] hold_gib`` makes it hold that much memory, touched: device memory on a GPU,
# RAM on the CPU.
PROBE = """
    import json
    import os

    import numpy as np


    class Model:
        def load(self, context):
            facts = {
                "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "device": context.device,
                "instance_index": context.instance_index,
            }
            hold = int(float(context.config.parameters.get("hold_gib", 0)) * 2**30)
            if context.device.startswith("cuda"):
                import torch

                properties = torch.cuda.get_device_properties(0)
                facts.update(
                    uuid=str(properties.uuid),
                    name=properties.name,
                    device_count=torch.cuda.device_count(),
                )
                # A context and a little memory, so that nvidia-smi lists this process.
                self.held = torch.ones(max(hold, 2**20), dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
            elif hold:
                self.held = np.ones(hold, dtype=np.uint8)
            folder = context.version_path / "instances"
            folder.mkdir(exist_ok=True)
            (folder / f"{os.getpid()}.json").write_text(json.dumps(facts))
            self.facts = json.dumps(facts).encode()

        def execute(self, inputs):
            batch = inputs["INPUT"].shape[0]
            return {"FACTS": np.array([[self.facts]] * batch, dtype=object)}
"""
PROBE_CONFIG = """
    backend = "python"
    max_batch_size = 8
    [[input]]
    name = "INPUT"
    datatype = "INT32"
    shape = [1]
    [[output]]
    name = "FACTS"
    datatype = "BYTES"
    shape = [1]
"""
OOM, ASSERT = 1, 2
# Answers its pid after a small computation on its GPU; flag OOM asks for four times the
# GPU's memory (torch.OutOfMemoryError), flag ASSERT indexes a CUDA tensor out of bounds (a
# device-side assert, which poisons the process's CUDA context; the pid goes to asserted.txt
# first, since the failed request cannot carry it).
FAULTS = f"""
    import json
    import os

    import numpy as np
    import torch


    class Model:
        def load(self, context):
            self.folder = context.version_path / "instances"
            self.folder.mkdir(exist_ok=True)
            self.ones = torch.ones(1024, device="cuda")
            (self.folder / f"{{os.getpid()}}.json").write_text(json.dumps({{"pid": os.getpid()}}))

        def execute(self, inputs):
            flag = int(inputs["INPUT"].max())
            if flag == {OOM}:
                total = torch.cuda.get_device_properties(0).total_memory
                torch.empty(4 * total, dtype=torch.uint8, device="cuda")
            if flag == {ASSERT}:
                (self.folder / "asserted.txt").write_text(str(os.getpid()))
                torch.zeros(1, device="cuda")[torch.tensor([5], device="cuda")]
                torch.cuda.synchronize()
            assert float((self.ones * 2).sum()) == 2048.0
            return {{"OUTPUT": np.full((inputs["INPUT"].shape[0], 1), os.getpid(), np.int64)}}
"""
FAULTS_CONFIG = """
    backend = "python"
    max_batch_size = 8
    [[input]]
    name = "INPUT"
    datatype = "INT32"
    shape = [1]
    [[output]]
    name = "OUTPUT"
    datatype = "INT64"
    shape = [1]
"""
IMAGE_CONFIG = """
    max_batch_size = {max_batch}
    [[input]]
    name = "INPUT"
    datatype = "FP32"
    shape = [3, 224, 224]
    [[output]]
    name = "OUTPUT"
    datatype = "FP32"
    shape = [1000]
    [optimization]
    precision = "{precision}"
"""


def export_program(arch: str, path: Path) -> None:
    """torchvision's ``arch`` with weights=None (seed 0) exported with a dynamic batch."""
    import warnings

    import torch
    import torchvision

    torch.manual_seed(0)
    module = getattr(torchvision.models, arch)(weights=None).eval()
    batch = torch.export.Dim("batch", min=1, max=256)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notices are not ours to fix
        program = torch.export.export(
            module, (torch.zeros(2, 3, 224, 224),), dynamic_shapes={"x": {0: batch}}
        )
    torch.export.save(program, str(path))


def load_program(path: Path, device: str) -> Any:
    """The exported module on ``device``, moved as the torch backend moves it."""
    import torch
    from torch.export.passes import move_to_device_pass

    return move_to_device_pass(torch.export.load(str(path)), torch.device(device)).module()


def autocast(device: str, precision: str) -> Any:
    import contextlib

    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return torch.autocast(device, dtype=dtype)


# -- phase 1: placement ----------------------------------------------------------------------


def placement(run: Run, phase: Phase) -> None:
    node = run.node
    if node.gpus and not node.cuda:
        node.gpu_ready(phase, "gpu placement")  # records the failure, and why
        return
    root = run.repository("placement")
    default = write_model(root, "default", PROBE_CONFIG, PROBE)
    on_gpu = node.gpu_ready(phase, "gpu placement")
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


# -- phase 2: precision ----------------------------------------------------------------------


def precision(run: Run, phase: Phase) -> None:
    import torch
    import tritonclient.http as triton

    node = run.node
    if node.gpus and not node.cuda:
        node.gpu_ready(phase, "precision on the GPU")  # records the failure, and why
        return
    device = "cuda" if node.gpus else "cpu"
    precisions = ["fp32", "bf16", "fp16"] if device == "cuda" else ["fp32", "bf16"]
    if device == "cpu":
        phase.skip_part("fp16", f"checked on a GPU only ({node.no_gpu_reason})")
    placed = groups("gpu", 1, [0]) if device == "cuda" else groups("cpu", 1)
    program = run.workdir / "exports" / "resnet18.pt2"
    with phase.timed("export"):
        export_program("resnet18", program)
    root = run.repository("precision")
    for name in precisions:
        version = write_model(
            root, f"resnet18_{name}", IMAGE_CONFIG.format(max_batch=8, precision=name) + placed
        )
        os.link(program, version / "model.pt2")
    with phase.timed("server ready"):
        server = run.serve("precision", root)

    # Two images are enough to compare; a CPU takes seconds per ResNet-18 batch.
    count = 4 if device == "cuda" else 2
    images = np.random.default_rng(0).standard_normal((count, 3, 224, 224)).astype(np.float32)
    served: dict[str, np.ndarray] = {}
    started = time.monotonic()
    client = triton.InferenceServerClient(
        server.address, connection_timeout=120.0, network_timeout=120.0
    )
    try:
        for name in precisions:
            tensor = triton.InferInput("INPUT", list(images.shape), "FP32")
            tensor.set_data_from_numpy(images, binary_data=True)
            wanted = [triton.InferRequestedOutput("OUTPUT", binary_data=True)]
            result = client.infer(f"resnet18_{name}", [tensor], outputs=wanted)
            served[name] = result.as_numpy("OUTPUT")
    finally:
        client.close()
    phase.facts.setdefault("timings_s", {})["served runs"] = round(time.monotonic() - started, 2)

    # The same run in this process: the backend's settings (IEEE fp32, no cuDNN timing).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    with phase.timed("direct load"):
        module = load_program(program, device)
    direct: dict[str, np.ndarray] = {}
    with phase.timed("direct runs"), torch.inference_mode():
        for name in precisions:
            with autocast(device, name):
                output = module(torch.from_numpy(images).to(device))
            direct[name] = output.float().cpu().numpy()
    del module

    scale = float(np.abs(direct["fp32"]).max())

    def diff(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.abs(a.astype(np.float64) - b).max())

    results: dict[str, dict[str, float]] = {}
    for name in precisions:
        results[name] = {
            "max_abs_diff_vs_direct_same_precision": diff(served[name], direct[name]),
            "max_abs_diff_vs_direct_fp32": diff(served[name], direct["fp32"]),
            "max_abs_diff_vs_served_fp32": diff(served[name], served["fp32"]),
            "top1_agreement_with_fp32": float(
                np.mean(served[name].argmax(1) == direct["fp32"].argmax(1))
            ),
        }
    phase.facts.update(device=device, output_scale=scale, per_precision=results)
    same = results["fp32"]["max_abs_diff_vs_direct_same_precision"]
    phase.check(
        "fp32: served equals the direct run",
        same <= 1e-4 * scale,
        f"max |diff| {same:.3g} (limit 1e-4 x scale {scale:.3g})",
    )
    for name in precisions[1:]:
        found = results[name]
        same = found["max_abs_diff_vs_direct_same_precision"]
        apart = found["max_abs_diff_vs_direct_fp32"]
        phase.check(
            f"{name}: served equals the direct autocast run",
            same <= 1e-2 * scale and same < apart,
            f"max |diff| {same:.3g} (limit 1e-2 x scale {scale:.3g}, and below {apart:.3g}, "
            "its distance from fp32)",
        )
        phase.check(
            f"{name}: differs from fp32",
            found["max_abs_diff_vs_served_fp32"] > 1e-6 * scale,
            f"max |served {name} - served fp32| {found['max_abs_diff_vs_served_fp32']:.3g}",
        )
    parts = [f"fp32 {results['fp32']['max_abs_diff_vs_direct_same_precision']:.2g}"] + [
        f"{name} {results[name]['max_abs_diff_vs_direct_same_precision']:.2g} "
        f"(its distance from fp32 {results[name]['max_abs_diff_vs_direct_fp32']:.2g})"
        for name in precisions[1:]
    ]
    phase.headline = f"{device}, max |served - direct| " + ", ".join(parts) + f", scale {scale:.3g}"


# -- phase 3: throughput ---------------------------------------------------------------------


class Plan(msgspec.Struct, frozen=True):
    """What the throughput phase measures: the real thing on a GPU, a smoke run on a CPU."""

    arch: str
    device: str  # "cuda" | "cpu"
    precision: str  # bf16 on a GPU; fp32 on a CPU, where bf16 without bf16 units is slow
    batches: tuple[int, ...]
    counts: tuple[int, ...]  # instances per configuration
    concurrency_per_instance: int
    seconds: float  # each measurement, after its warmup
    warmup_s: float
    first_requests: int


class GpuSampler:
    """nvidia-smi's utilization.gpu sampled every half second while a measurement runs."""

    def __init__(self, uuid: str | None) -> None:
        self.samples: list[int] = []
        self._uuid = uuid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                rows = _smi("--query-gpu=uuid,utilization.gpu")
                self.samples += [int(row[1]) for row in rows if row[0] == self._uuid]
            except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired):
                return

    @contextmanager
    def running(self) -> Iterator[None]:
        if self._uuid is not None:
            self._thread.start()
        try:
            yield
        finally:
            self._stop.set()

    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None


def pure_images_per_s(
    module: Any, device: str, precision: str, batch: int, seconds: float
) -> dict[str, float]:
    """ResNet images/s of the module alone under the backend's autocast: the input already
    on the device (the bound), and with the copies a server pays (host input in, logits
    back)."""
    import torch

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    on_device = torch.randn(batch, 3, 224, 224, device=device)
    host = torch.randn(batch, 3, 224, 224)
    if device == "cuda":
        host = host.pin_memory()
    found = {}
    with torch.inference_mode(), autocast(device, precision):
        for label, step in (
            ("on_device", lambda: module(on_device)),
            ("with_copies", lambda: module(host.to(device, non_blocking=True)).float().cpu()),
        ):
            for _ in range(5):
                step()
            synchronize()
            started, runs = time.perf_counter(), 0
            while time.perf_counter() - started < seconds:
                step()
                runs += 1
            synchronize()  # kernels queued inside the window finish before it closes
            found[label] = round(runs * batch / (time.perf_counter() - started), 1)
    return found


def throughput(run: Run, phase: Phase) -> None:
    import torch

    node = run.node
    seconds = run.args.seconds
    if node.gpus or not run.args.cpu_smoke:
        if not node.gpu_ready(phase, "throughput"):
            phase.skipped = (
                f"{node.no_gpu_reason} (ResNet-50 images/s against pure torch means something "
                "on a GPU only; --cpu-smoke runs a tiny CPU version)"
            )
            return
        plan = Plan("resnet50", "cuda", "bf16", (16, 32), (1, 2), 8, seconds, 2.0, 50)
    else:
        plan = Plan("resnet18", "cpu", "fp32", (2, 4), (1, 2), 1, min(seconds, 3.0), 1.0, 20)
        phase.facts["note"] = "--cpu-smoke: a CPU run of the code path; its numbers mean little"
    phase.facts["plan"] = msgspec.to_builtins(plan)
    program = run.workdir / "exports" / f"{plan.arch}.pt2"
    with phase.timed("export"):
        export_program(plan.arch, program)

    # Pure torch first, then free the device for the server.
    torch.backends.cudnn.benchmark = True  # as the served models ask (cudnn_benchmark)
    with phase.timed("pure torch"):
        module = load_program(program, plan.device)
        pure = {
            batch: pure_images_per_s(module, plan.device, plan.precision, batch, plan.seconds / 2)
            for batch in plan.batches
        }
    del module
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    phase.facts["pure_torch_images_per_s"] = pure

    root = run.repository("throughput")
    largest = max(plan.batches)
    placed = "gpu" if plan.device == "cuda" else "cpu"
    preferred = list(plan.batches)
    for name, count in [(f"{plan.arch}_x{count}", count) for count in plan.counts] + [
        (f"{plan.arch}_fresh", 1)
    ]:
        config = (
            IMAGE_CONFIG.format(max_batch=largest, precision=plan.precision)
            + groups(placed, count, [0] if placed == "gpu" else None)
            + f"[dynamic_batching]\npreferred_batch_size = {preferred}\n"
            + "max_queue_delay_microseconds = 500\n"
            + ("[parameters]\ncudnn_benchmark = true\n" if placed == "gpu" else "")
            + f'[[warmup]]\nbatch_size = {largest}\ninputs = {{ INPUT = "random" }}\n'
        )
        os.link(program, write_model(root, name, config) / "model.pt2")
    measured = [f"{plan.arch}_x{count}" for count in plan.counts]
    with phase.timed("server ready"):
        server = run.serve("throughput", root, *explicit(*measured))

    rng = np.random.default_rng(0)
    raw = {
        batch: rng.standard_normal((batch, 3, 224, 224)).astype(np.float32).tobytes()
        for batch in plan.batches
    }
    rows = []
    uuid = node.gpus[0].uuid if plan.device == "cuda" else None
    for count, model in zip(plan.counts, measured, strict=True):
        for batch in plan.batches:
            payload = loadgen.encode_binary_infer(
                server.address,
                model,
                [("INPUT", "FP32", [batch, 3, 224, 224], raw[batch])],
                ["OUTPUT"],
            )
            concurrency = plan.concurrency_per_instance * count
            items, batches = server.stats(model)
            sampler = GpuSampler(uuid)
            with sampler.running():
                result = asyncio.run(
                    loadgen.closed_loop(
                        f"{model} b{batch}", "127.0.0.1", server.port, [payload],
                        concurrency, plan.seconds, plan.warmup_s,
                    )
                )  # fmt: skip
            items_after, batches_after = server.stats(model)
            images = round(result.throughput * batch, 1)
            ratio = round(images / pure[batch]["on_device"], 3)
            rows.append(
                {
                    "instances": count,
                    "batch": batch,
                    "concurrency": concurrency,
                    "images_per_s": images,
                    "pure_images_per_s": pure[batch]["on_device"],
                    "ratio": ratio,
                    "ratio_vs_pure_with_copies": round(images / pure[batch]["with_copies"], 3),
                    "p50_ms": round(result.p50_ms, 2),
                    "p99_ms": round(result.p99_ms, 2),
                    "errors": result.errors,
                    "mean_server_batch": round(
                        (items_after - items) / max(1, batches_after - batches), 1
                    ),
                    "gpu_utilization_pct": sampler.mean(),
                }
            )
            phase.check(f"x{count} batch {batch}: no errors", result.errors == 0, f"{rows[-1]}")
            phase.check(
                f"x{count} batch {batch}: >= 0.9x pure torch images/s",
                ratio >= 0.9,
                f"{images} vs {pure[batch]['on_device']} images/s: {ratio}x",
                goal=True,
            )
    phase.facts["server"] = rows

    # A model loaded now serves its first requests warm (its [[warmup]] ran on the instance).
    fresh = f"{plan.arch}_fresh"
    started = time.monotonic()
    loaded = server.http.post(f"/v2/repository/models/{fresh}/load")
    load_s = round(time.monotonic() - started, 2)
    phase.check("fresh model loads", loaded.status_code == 200, loaded.text[:300])
    server.wait_model_ready(fresh)
    batch = plan.batches[0]
    latencies, failures = _sequential(server, fresh, batch, raw[batch], 2 * plan.first_requests)
    first, rest = latencies[: plan.first_requests], latencies[plan.first_requests :]
    first_p99, rest_p99 = percentile_ms(first, 99), percentile_ms(rest, 99)
    phase.facts["first_requests"] = {
        "load_s": load_s,
        "batch": batch,
        "count": plan.first_requests,
        "first_p50_ms": percentile_ms(first, 50),
        "first_p99_ms": first_p99,
        "first_max_ms": percentile_ms(first, 100),
        "next_p50_ms": percentile_ms(rest, 50),
        "next_p99_ms": rest_p99,
        "failures": failures,
    }
    phase.check("first requests all succeed", not failures, f"{failures[:3]}")
    phase.check(
        f"first-{plan.first_requests} p99 within 2x of the next {plan.first_requests}'s",
        first_p99 <= 2 * rest_p99,
        f"{first_p99} ms vs {rest_p99} ms",
        goal=True,
    )
    best = {
        batch: max(row["ratio"] for row in rows if row["batch"] == batch) for batch in plan.batches
    }
    phase.headline = (
        ", ".join(
            f"b{row['batch']} x{row['instances']}: {row['images_per_s']:.0f} img/s "
            f"({row['ratio']:.2f}x)"
            for row in rows
        )
        + f"; first-{plan.first_requests} p99 {first_p99} ms (next {rest_p99} ms)"
    )
    phase.facts["best_ratio_per_batch"] = best


def _sequential(
    server: Server, model: str, batch: int, raw: bytes, count: int
) -> tuple[list[float], list[str]]:
    """``count`` requests one after another with tritonclient; latencies and failures."""
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    images = np.frombuffer(raw, np.float32).reshape(batch, 3, 224, 224)
    client = triton.InferenceServerClient(
        server.address, connection_timeout=120.0, network_timeout=120.0
    )
    latencies, failures = [], []
    try:
        for _ in range(count):
            tensor = triton.InferInput("INPUT", list(images.shape), "FP32")
            tensor.set_data_from_numpy(images, binary_data=True)
            wanted = [triton.InferRequestedOutput("OUTPUT", binary_data=True)]
            started = time.perf_counter()
            try:
                client.infer(model, [tensor], outputs=wanted)
            except InferenceServerException as exc:
                failures.append(str(exc)[:300])
                continue
            latencies.append(time.perf_counter() - started)
    finally:
        client.close()
    return latencies, failures


# -- phase 4: faults -------------------------------------------------------------------------


class HealthPoller:
    """``GET /v2/health/live`` every 10 ms from a thread; the latency of each."""

    def __init__(self, url: str) -> None:
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self._url, timeout=5) as http:
            while not self._stop.wait(0.01):
                started = time.perf_counter()
                try:
                    status = http.get("/v2/health/live").status_code
                except httpx.HTTPError as exc:
                    status = f"{type(exc).__name__}"
                self.latencies.append(time.perf_counter() - started)
                if status != 200:
                    self.errors.append(str(status))

    @contextmanager
    def running(self) -> Iterator[None]:
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join(10)


def faults(run: Run, phase: Phase) -> None:
    node = run.node
    if node.gpus and not node.cuda:
        node.gpu_ready(phase, "faults on the GPU")  # records the failure, and why
        return
    root = run.repository("faults")
    on_gpu = node.gpu_ready(phase, "out of memory")
    if on_gpu:
        write_model(root, "fault_oom", FAULTS_CONFIG + groups("gpu", 1, [0]), FAULTS)
        write_model(root, "fault_assert", FAULTS_CONFIG + groups("gpu", 2, [0]), FAULTS)
        hold_gib = round(min(20.0, node.gpus[0].memory_total_mib / 1024 * 0.4), 1)
        where = groups("gpu", 1, [0])
    else:
        phase.skip_part("device assert", node.no_gpu_reason)
        hold_gib = 1.5
        where = groups("cpu", 1)
    big = write_model(
        root, "big", PROBE_CONFIG + where + f"[parameters]\nhold_gib = {hold_gib}\n", PROBE
    )
    server = run.serve("faults", root)
    if on_gpu:
        _out_of_memory(server, phase)
        _device_assert(server, phase, root / "fault_assert" / "1")

    # SIGKILL of an instance holding a lot of memory: the front keeps answering at once
    # (its teardown is off the event loop) and the model comes back.
    old = instance_facts(big)[-1]["pid"]
    poller = HealthPoller(server.url)
    with poller.running():
        time.sleep(1.0)
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        back_s = None
        while time.monotonic() - killed < 120:
            pids = [fact["pid"] for fact in instance_facts(big)]
            if pids[-1] != old and server.http.get("/v2/models/big/ready").status_code == 200:
                back_s = round(time.monotonic() - killed, 2)
                break
            time.sleep(0.05)
        time.sleep(1.0)
    worst = percentile_ms(poller.latencies, 100)
    phase.facts["sigkill"] = {
        "held_gib": hold_gib,
        "device": "gpu" if on_gpu else "cpu",
        "health_polls": len(poller.latencies),
        "health_p50_ms": percentile_ms(poller.latencies, 50),
        "health_p99_ms": percentile_ms(poller.latencies, 99),
        "health_worst_ms": worst,
        "health_errors": poller.errors[:10],
        "back_ready_s": back_s,
    }
    phase.check(
        f"SIGKILL of a {hold_gib:g} GiB instance: /v2/health/live stays fast",
        worst < 1000 and not poller.errors,
        f"worst {worst} ms over {len(poller.latencies)} polls, errors {poller.errors[:3]}",
    )
    phase.check("the killed instance's model is ready again", back_s is not None, f"{back_s} s")
    phase.check("the killed process is gone", process_gone(old), f"pid {old}")
    phase.headline = f"SIGKILL {hold_gib:g} GiB: health worst {worst} ms, back in {back_s} s" + (
        f"; {phase.facts['out_of_memory']['summary']}; {phase.facts['device_assert']['summary']}"
        if on_gpu
        else ""
    )


def _out_of_memory(server: Server, phase: Phase) -> None:
    def pid() -> int | None:
        answer = server.infer_flag("fault_oom", 0)
        return answer.json()["outputs"][0]["data"][0] if answer.status_code == 200 else None

    before = pid()
    failed = server.infer_flag("fault_oom", OOM)
    after = pid()
    phase.facts["out_of_memory"] = {
        "pid_before": before,
        "status": failed.status_code,
        "error": failed.text[:500],
        "pid_after": after,
        "summary": f"OOM -> {failed.status_code}, then pid {'same' if after == before else after}",
    }
    phase.check(
        "out of memory: that request gets a 500 saying so",
        failed.status_code == 500 and "out of memory" in failed.text.lower(),
        f"{failed.status_code} {failed.text[:300]}",
    )
    phase.check(
        "out of memory: the next request succeeds on the same instance",
        before is not None and after == before,
        f"pid before {before}, after {after}",
    )


def _device_assert(server: Server, phase: Phase, version: Path) -> None:
    before = {fact["pid"] for fact in instance_facts(version)}
    failed = server.infer_flag("fault_assert", ASSERT)
    marker = version / "instances" / "asserted.txt"
    asserted = int(marker.read_text()) if marker.exists() else -1  # -1: it never ran
    answers = [server.infer_flag("fault_assert", 0) for _ in range(20)]
    good = [answer for answer in answers if answer.status_code == 200]
    served_by = Counter(answer.json()["outputs"][0]["data"][0] for answer in good)
    started = time.monotonic()
    replacement: set[int] = set()
    while time.monotonic() - started < 60:
        replacement = {fact["pid"] for fact in instance_facts(version)} - before
        if replacement and process_gone(asserted):
            break
        time.sleep(0.1)
    phase.facts["device_assert"] = {
        "status": failed.status_code,
        "error": failed.text[:500],
        "asserted_pid": asserted,
        "after": [answer.status_code for answer in answers],
        "served_by": dict(served_by),
        "replacement_pids": sorted(replacement),
        "summary": f"assert -> {failed.status_code}, then {len(good)}/20 served",
    }
    phase.check(
        "device assert: a 500 saying the instance is being replaced",
        failed.status_code == 500 and "being replaced" in failed.text,
        f"{failed.status_code} {failed.text[:300]}",
    )
    phase.check(
        "device assert: the 20 requests after it succeed",
        len(good) == 20 and asserted not in served_by,
        f"{[answer.status_code for answer in answers]}, served by {dict(served_by)}",
    )
    phase.check(
        "device assert: the instance ends and a replacement loads",
        bool(replacement) and asserted > 0 and process_gone(asserted),
        f"asserted pid {asserted} gone: {process_gone(asserted)}, new {sorted(replacement)}",
    )


# -- the run ---------------------------------------------------------------------------------

PHASE_FUNCTIONS: dict[str, Callable[[Run, Phase], None]] = {
    "placement": placement,
    "precision": precision,
    "throughput": throughput,
    "faults": faults,
}


def _on_alarm(signum: int, frame: object) -> None:
    raise BudgetExceeded


def run_phase(run: Run, name: str, deadline: float) -> PhaseReport:
    phase = Phase(name)
    left = deadline - time.monotonic()
    if name not in run.args.phases:
        phase.skipped = "not selected (--phases)"
        return phase.report(0.0, None, {})
    if left < ESTIMATE_S[name]:
        phase.skipped = (
            f"time budget: {left:.0f} s left, this phase needs about {ESTIMATE_S[name]:g} s"
        )
        return phase.report(0.0, None, {})
    started = time.monotonic()
    error = None
    signal.setitimer(signal.ITIMER_REAL, max(left, 0.01))
    try:
        PHASE_FUNCTIONS[name](run, phase)
    except BudgetExceeded:
        error = f"stopped: the run's time budget (--budget-s {run.args.budget_s:g}) ran out"
    except Exception:
        error = traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        logs = run.stop_servers()
    return phase.report(time.monotonic() - started, error, logs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="folder for the JSON")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole run's limit")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, in order")
    parser.add_argument("--seconds", type=float, default=8.0, help="each throughput measurement")
    parser.add_argument("--cpu-smoke", action="store_true", help="throughput on a CPU, tiny")
    args = parser.parse_args(argv)
    args.phases = [name.strip() for name in args.phases.split(",") if name.strip()]
    unknown = sorted(set(args.phases) - set(PHASES))
    if unknown:
        parser.error(f"unknown phase(s) {unknown}; choose from {', '.join(PHASES)}")
    started = time.monotonic()
    deadline = started + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGALRM, _on_alarm)

    node = Node()
    where = ", ".join(f"{gpu.index}: {gpu.name} {gpu.uuid}" for gpu in node.gpus)
    print(
        f"gpu_check: {len(node.gpus)} GPU(s) {where or node.no_gpu_reason}; torch {node.torch} "
        f"(CUDA {'yes' if node.cuda else 'no'}); budget {args.budget_s:g} s; JSON in {args.out}/",
        flush=True,
    )
    lines = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
        run = Run(args, node, Path(workdir))
        for name in PHASES:
            report = run_phase(run, name, deadline)
            (args.out / f"{name}.json").write_bytes(msgspec.json.format(_encode(report)))
            text = report.headline if report.status == "passed" else report.reason
            if report.status == "passed" and report.reason:
                text += f" [{report.reason}]"
            passed = sum(check.ok for check in report.checks)
            counts = f"{passed}/{len(report.checks)} checks"
            line = f"{name:<11} {report.status:<8} {report.seconds:6.1f} s  {counts:<11} {text}"
            print(line, flush=True)
            lines.append(PhaseLine(name, report.status, report.seconds, line))
    ok = all(line.status != "failed" for line in lines)
    summary = Summary(
        ok=ok,
        seconds=round(time.monotonic() - started, 1),
        budget_s=args.budget_s,
        python=sys.version.split()[0],
        torch=node.torch,
        cuda_available=node.cuda,
        gpus=node.gpus,
        no_gpu_reason=node.no_gpu_reason,
        phases=lines,
    )
    (args.out / "summary.json").write_bytes(msgspec.json.format(_encode(summary)))
    failed = [line.phase for line in lines if line.status == "failed"]
    verdict = "PASS" if ok else f"FAIL ({', '.join(failed)})"
    print(f"gpu_check: {verdict} in {summary.seconds:g} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
