"""What ``reposerve tune`` may change in a model's configuration: one ``Knob`` per setting,
each with the values it tries on this machine, and why a knob does not apply when it
doesn't (reported, never silently left out).

A knob reads its value from a ModelConfig and writes one into a copy. Values are plain
ints, strings and bools, so a candidate is a small mapping that JSON holds as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from msgspec.structs import replace

from reposerve.config.backends import backend_entry
from reposerve.config.schema import DynamicBatching, InstanceGroup, ModelConfig

Value = int | str | bool

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
QUEUE_DELAYS_US = (0, 100, 500, 1000, 2000, 5000, 10000)
# Backends whose instances honour [parameters] intra_op_threads (a python model runs
# whatever threads it starts itself).
THREADED_BACKENDS = ("onnxruntime", "torch")
AUTO_THREADS = 0  # intra_op_threads unset: placement gives each instance its share


class Machine(msgspec.Struct, frozen=True):
    cores: int
    gpus: int


class Knob:
    """One setting: ``ladder`` is the values tried, in order; ``numeric`` knobs are walked
    from the current value outward and refined between ladder steps no lower than
    ``refine_from`` (below it a value means something else: batching off, threads auto);
    the others have each value tried. ``checked`` knobs change the outputs (precision): a
    candidate with one is compared with fp32 first."""

    def __init__(
        self,
        name: str,
        ladder: tuple[Value, ...],
        read: Callable[[ModelConfig], Value],
        write: Callable[[ModelConfig, Value], ModelConfig],
        *,
        numeric: bool = True,
        checked: bool = False,
        refine_from: int = 1,
        needs: Callable[[ModelConfig], str | None] = lambda config: None,
    ) -> None:
        self.name = name
        self.refine_from = refine_from  # the least value a midpoint may lie between
        self.ladder = ladder
        self.read = read
        self.write = write
        self.numeric = numeric
        self.checked = checked
        self._needs = needs

    def unusable(self, config: ModelConfig) -> str | None:
        """Why this knob cannot be turned on ``config`` as it stands, or None."""
        return self._needs(config)

    def describe(self, value: Value) -> str:
        if self.name == "intra_op_threads" and value == AUTO_THREADS:
            return "intra_op_threads auto"
        if self.name == "max_batch_size" and value == 1:
            return "no dynamic batching"
        return f"{self.name} {value}"


def knobs_for(
    config: ModelConfig, backend: str, machine: Machine, smallest_batch: int = 1
) -> tuple[list[Knob], list[str]]:
    """The knobs ``reposerve tune`` turns on a model of ``backend`` on ``machine``, in the
    order they are searched (most paying first), and one line per knob left out, with why.
    ``smallest_batch``: the largest batch a sample request carries, below which
    max_batch_size is never lowered."""
    knobs: list[Knob] = []
    left_out: list[str] = []
    if config.max_batch_size > 0:
        knobs.append(_batch_knob(max(smallest_batch, 1)))
        knobs.append(_delay_knob())
    else:
        left_out.append("batching: max_batch_size is 0 (the model takes no batch dimension)")
    groups = config.instance_group
    if groups is not None and len(groups) > 1:
        left_out.append("instance count: the model has several instance groups")
    elif groups is not None and groups[0].kind == "model":
        left_out.append("instance count: KIND_MODEL instances place themselves")
    else:
        knobs.append(_instances_knob(machine, _on_gpu(config, machine)))
    if backend in THREADED_BACKENDS:
        knobs.append(_threads_knob(machine.cores))
    else:
        left_out.append(f"intra-op threads: a {backend} model starts its own threads")
    precisions = backend_entry(backend).precisions if backend in THREADED_BACKENDS else ()
    if len(precisions) > 1:
        knobs.append(_precision_knob(precisions))
    else:
        left_out.append(f"precision: the {backend} backend runs the model as it is written")
    if _on_gpu(config, machine):
        knobs += _gpu_knobs(backend)
    else:
        left_out.append(
            "GPU speed options (cuDNN benchmark, torch.compile, TensorRT): "
            + ("the model runs on the CPU" if machine.gpus else "no GPU on this machine")
        )
    return knobs, left_out


def _on_gpu(config: ModelConfig, machine: Machine) -> bool:
    if machine.gpus == 0:
        return False
    groups = config.instance_group
    return groups is None or any(group.kind in ("gpu", "auto") for group in groups)


def _batch_knob(smallest: int) -> Knob:
    def read(config: ModelConfig) -> Value:
        return config.max_batch_size if config.dynamic_batching is not None else 1

    def write(config: ModelConfig, value: Value) -> ModelConfig:
        assert isinstance(value, int)
        if value == 1:
            # Requests still carry batches of their own up to max_batch_size.
            return replace(config, dynamic_batching=None)
        # No preferred sizes: batches form up to max_batch_size, as Model Analyzer searches.
        batching = replace(config.dynamic_batching or DynamicBatching(), preferred_batch_size=[])
        return replace(config, max_batch_size=value, dynamic_batching=batching)

    ladder = tuple(size for size in BATCH_SIZES if size == 1 or size >= smallest)
    return Knob("max_batch_size", ladder, read, write, refine_from=2)


def _delay_knob() -> Knob:
    def read(config: ModelConfig) -> Value:
        batching = config.dynamic_batching
        return batching.max_queue_delay_microseconds if batching is not None else 0

    def write(config: ModelConfig, value: Value) -> ModelConfig:
        assert config.dynamic_batching is not None and isinstance(value, int)
        batching = replace(config.dynamic_batching, max_queue_delay_microseconds=value)
        return replace(config, dynamic_batching=batching)

    def needs(config: ModelConfig) -> str | None:
        return None if config.dynamic_batching is not None else "dynamic batching is off"

    delays = QUEUE_DELAYS_US
    return Knob("max_queue_delay_microseconds", delays, read, write, refine_from=0, needs=needs)


def _instances_knob(machine: Machine, on_gpu: bool) -> Knob:
    def read(config: ModelConfig) -> Value:
        return config.instance_group[0].count if config.instance_group else 1

    def write(config: ModelConfig, value: Value) -> ModelConfig:
        assert isinstance(value, int)
        group = config.instance_group[0] if config.instance_group else InstanceGroup(kind="auto")
        return replace(config, instance_group=[replace(group, count=value)])

    # Per GPU a few instances overlap copies and kernels; on the CPU, up to one per core
    # (at least 4, since instances that wait on I/O or sleep share cores well).
    limit = 4 if on_gpu else max(4, machine.cores)
    ladder = tuple(n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if n <= limit)
    return Knob("instances", ladder, read, write)


def _threads_knob(cores: int) -> Knob:
    def read(config: ModelConfig) -> Value:
        return int(config.parameters.get("intra_op_threads") or AUTO_THREADS)

    def write(config: ModelConfig, value: Value) -> ModelConfig:
        parameters = {k: v for k, v in config.parameters.items() if k != "intra_op_threads"}
        if value != AUTO_THREADS:
            parameters["intra_op_threads"] = value
        return replace(config, parameters=parameters)

    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    if counts[-1] != cores:
        counts.append(cores)
    return Knob("intra_op_threads", (AUTO_THREADS, *counts), read, write)


def _precision_knob(precisions: tuple[str, ...]) -> Knob:
    def read(config: ModelConfig) -> Value:
        return config.optimization.precision

    def write(config: ModelConfig, value: Value) -> ModelConfig:
        return replace(config, optimization=replace(config.optimization, precision=value))

    return Knob("precision", precisions, read, write, numeric=False, checked=True)


def _switch_knob(name: str, path: tuple[str, ...], on: Any = True) -> Knob:
    """A backend option at ``[parameters]`` path (its last part the key), off when absent
    or false, and ``on`` written to turn it on."""

    def read(config: ModelConfig) -> Value:
        node: Any = config.parameters
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        return node is not None and node is not False

    def write(config: ModelConfig, value: Value) -> ModelConfig:
        parameters = _without(config.parameters, path)
        if value:
            node = parameters
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = on
        return replace(config, parameters=parameters)

    return Knob(name, (False, True), read, write, numeric=False)


def _without(table: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    copy = {key: dict(value) if isinstance(value, dict) else value for key, value in table.items()}
    node = copy
    for part in path[:-1]:
        child = node.get(part)
        node = child if isinstance(child, dict) else {}
    node.pop(path[-1], None)
    return copy


def _gpu_knobs(backend: str) -> list[Knob]:
    if backend == "torch":
        return [
            _switch_knob("cudnn_benchmark", ("cudnn_benchmark",)),
            _switch_knob("torch_compile", ("torch_compile",)),
        ]
    if backend == "onnxruntime":
        return [_switch_knob("tensorrt", ("onnxruntime", "tensorrt"), on={})]
    return []
