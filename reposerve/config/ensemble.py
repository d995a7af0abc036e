"""What an ensemble's config alone must satisfy: its steps form a DAG over its tensors.

Every tensor a step reads is an ensemble input or written by exactly one step; every
ensemble output is written by a step; every ensemble input is read by some step; and no
step waits, through others, for its own output. What the step models themselves declare
(their tensors' names, datatypes and shapes) is checked when the ensemble loads, against
the models as loaded (``reposerve.pipelines.ensemble``).
"""

from __future__ import annotations

from reposerve.config.backends import backend_entry
from reposerve.config.schema import ModelConfig


def check_ensemble(config: ModelConfig) -> str | None:
    """The first problem as ``key: reason``, or None."""
    if config.backend is None or not backend_entry(config.backend).pipeline:
        if config.step:
            return 'step: only an ensemble has steps. Hint: set backend = "ensemble"'
        return None
    if not config.step:
        return "step: an ensemble needs at least one step"
    if not config.input or not config.output:
        return "input, output: an ensemble declares the tensors it takes and gives"
    for index, spec in enumerate(config.input):
        if spec.optional:
            return f"input[{index}].optional: an ensemble's inputs are all required"
    for key in ("instance_group", "dynamic_batching"):
        if getattr(config, key):
            return f"{key}: an ensemble has none (each step model has its own)"
    if config.warmup or config.decoupled:
        return f"{'warmup' if config.warmup else 'decoupled'}: not supported for an ensemble"
    inputs = {tensor.name for tensor in config.input}
    writers: dict[str, int] = {}
    for index, step in enumerate(config.step):
        for tensor in step.output_map.values():
            if tensor in inputs:
                return f'step[{index}].output_map: "{tensor}" is an ensemble input'
            if tensor in writers:
                return (
                    f'step[{index}].output_map: "{tensor}" is written by step[{writers[tensor]}] '
                    "already; each tensor has one writer"
                )
            writers[tensor] = index
        if not step.output_map:
            return f"step[{index}].output_map: a step must write at least one tensor"
    read: set[str] = set()
    for index, step in enumerate(config.step):
        for model_input, tensor in step.input_map.items():
            if tensor not in inputs and tensor not in writers:
                return (
                    f'step[{index}].input_map.{model_input}: "{tensor}" is neither an ensemble '
                    "input nor written by a step"
                )
            read.add(tensor)
    for spec in config.output:
        if spec.name not in writers:
            return f'output: "{spec.name}" is written by no step'
    unread = sorted(inputs - read)
    if unread:
        return f'input: "{unread[0]}" is read by no step'
    cycle = _cycle(config, writers)
    if cycle:
        return "step: the steps form a cycle: " + " -> ".join(f"step[{i}]" for i in cycle)
    return None


def _cycle(config: ModelConfig, writers: dict[str, int]) -> list[int]:
    """Steps that wait for one another in a circle (each for a tensor the next writes),
    the first one repeated at the end; [] when there are none."""
    after = {  # step -> the steps whose tensors it reads
        index: sorted({writers[t] for t in step.input_map.values() if t in writers})
        for index, step in enumerate(config.step)
    }
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    path: list[int] = []

    def visit(node: int) -> list[int]:
        state[node] = 1
        path.append(node)
        for previous in after[node]:
            if state.get(previous) == 1:
                return [*path[path.index(previous) :], previous]
            if previous not in state:
                found = visit(previous)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in after:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []
