"""Sequence batching in a config: its rules, the tensors the model sees beyond the ones a
client sends (control inputs, implicit state), and Triton's form of it both ways.

The model's config (what its instances load) holds every tensor it reads and writes; the
client's (what requests are checked against, what ``/config`` shows) holds only those a
client sends and may ask for, as in Triton, where control inputs and state live under
``sequence_batching`` and not among the inputs.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

import msgspec

from reposerve.config.padding import lengths_tensor
from reposerve.config.schema import ModelConfig, SequenceBatching, TensorConfig
from reposerve.datatypes import TRITON_CONFIG_TYPES
from reposerve.errors import ConfigError

FLAG_TYPES = ("INT32", "FP32", "BOOL")  # start, end, ready
CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")


def check_sequence_batching(config: ModelConfig) -> str | None:
    """The first problem of ``config.sequence_batching`` as ``key: reason``, or None."""
    sequence = config.sequence_batching
    if sequence is None:
        return None
    where = "sequence_batching"
    if config.dynamic_batching is not None:
        return f"{where}: a model has dynamic_batching or sequence_batching, not both"
    if config.step:
        return f"{where}: an ensemble has no instances of its own to keep sequences on"
    taken = {tensor.name for tensor in config.input}
    kinds: set[str] = set()
    for index, control in enumerate(sequence.control_input):
        here = f"{where}.control_input[{index}]"
        if control.name in taken:
            return f'{here}.name: "{control.name}" is already an input of the model'
        taken.add(control.name)
        if control.kind in kinds:
            return f"{here}.kind: a second {control.kind} control (one of each kind)"
        kinds.add(control.kind)
        allowed = CORRID_TYPES if control.kind == "corrid" else FLAG_TYPES
        if control.datatype not in allowed:
            return (
                f"{here}.datatype: {control.datatype} for a {control.kind} control; "
                f"use one of {', '.join(allowed)}"
            )
        if control.kind == "corrid" and control.false_true is not None:
            return f"{here}.false_true: a corrid control carries the id, not a flag"
    outputs = {tensor.name for tensor in config.output}
    for index, state in enumerate(sequence.state):
        here = f"{where}.state[{index}]"
        if state.input_name in taken:
            return f'{here}.input_name: "{state.input_name}" is already an input of the model'
        taken.add(state.input_name)
        declared = next((t for t in config.output if t.name == state.output_name), None)
        if declared is not None and (declared.datatype, declared.shape) != (
            state.datatype,
            state.shape,
        ):
            return f'{here}.output_name: output "{state.output_name}" is declared otherwise'
        if state.output_name in outputs and declared is None:
            return f'{here}.output_name: "{state.output_name}" is named twice'
        outputs.add(state.output_name)
        initial = state.initial_state
        if initial is not None:
            if initial.data_file is not None and state.datatype == "BYTES":
                return f"{here}.initial_state.data_file: a BYTES state starts empty (no file)"
            if initial.data_file is not None and not _in_its_folder(initial.data_file):
                return (
                    f'{here}.initial_state.data_file: "{initial.data_file}" must name a file '
                    "in the model's initial_state folder (a relative path, no '..')"
                )
            if initial.datatype != state.datatype:
                return (
                    f"{here}.initial_state.datatype: {initial.datatype}, the state's is "
                    f"{state.datatype}"
                )
            if len(initial.shape) != len(state.shape) or any(
                want not in (-1, got) for want, got in zip(state.shape, initial.shape, strict=True)
            ):
                return f"{here}.initial_state.shape: {initial.shape} does not fit {state.shape}"
    if sequence.state and config.decoupled:
        return f"{where}.state: a decoupled model's responses have no one state to keep"
    if sequence.strategy == "direct" and (
        sequence.preferred_batch_size or sequence.max_candidate_sequences is not None
    ):
        return (
            f"{where}: preferred_batch_size and max_candidate_sequences are the oldest strategy's"
        )
    for size in sequence.preferred_batch_size:
        if size > max(config.max_batch_size, 1):
            return (
                f"{where}.preferred_batch_size: {size} exceeds max_batch_size "
                f"{config.max_batch_size}"
            )
    return None


def _in_its_folder(data_file: str) -> bool:
    """Whether ``data_file`` names a path under the initial_state folder, as Triton reads
    it (``<model>/initial_state/<data_file>``); symlinks are the reader's to check."""
    path = PurePath(data_file)
    return bool(data_file) and not path.is_absolute() and ".." not in path.parts


def implied_tensors(config: ModelConfig) -> tuple[set[str], set[str]]:
    """The inputs and outputs the server fills and keeps (the sequence batcher's control
    inputs and state, the padding's lengths input): the model's, never a client's."""
    lengths = lengths_tensor(config)
    inputs = set() if lengths is None else {lengths.name}
    sequence = config.sequence_batching
    if sequence is None:
        return inputs, set()
    inputs |= {c.name for c in sequence.control_input} | {s.input_name for s in sequence.state}
    return inputs, {s.output_name for s in sequence.state}


def model_facing(config: ModelConfig) -> ModelConfig:
    """``config`` as its instances load it: the control inputs and the state's input and
    output join the tensors the model reads and writes, as does ``lengths_input``."""
    lengths = lengths_tensor(config)
    sequence = config.sequence_batching
    if sequence is None:
        if lengths is None:
            return config
        return msgspec.structs.replace(config, input=[*config.input, lengths])
    inputs = [
        *config.input,
        *(
            TensorConfig(name=c.name, datatype=c.datatype, shape=[1])
            for c in sequence.control_input
        ),
        *(
            TensorConfig(name=s.input_name, datatype=s.datatype, shape=s.shape)
            for s in sequence.state
        ),
    ]
    declared = {tensor.name for tensor in config.output}
    outputs = [
        *config.output,
        *(
            TensorConfig(name=s.output_name, datatype=s.datatype, shape=s.shape)
            for s in sequence.state
            if s.output_name not in declared
        ),
    ]
    return msgspec.structs.replace(config, input=inputs, output=outputs)


def client_facing(config: ModelConfig, declared: ModelConfig) -> ModelConfig:
    """A model-facing ``config`` (as an instance completed it) back to what clients send
    and may ask for: without the control, state and lengths inputs, and with a state
    output only where ``declared`` (the config as written) lists it among the outputs."""
    hidden_inputs, implied_outputs = implied_tensors(config)
    shown = {tensor.name for tensor in declared.output}
    hidden_outputs = implied_outputs - shown
    if not hidden_inputs and not hidden_outputs:
        return config
    return msgspec.structs.replace(
        config,
        input=[tensor for tensor in config.input if tensor.name not in hidden_inputs],
        output=[tensor for tensor in config.output if tensor.name not in hidden_outputs],
    )


# Triton's form: ModelSequenceBatching, as its JSON and config.pbtxt hold it.

_KINDS = {
    "CONTROL_SEQUENCE_START": "start",
    "CONTROL_SEQUENCE_END": "end",
    "CONTROL_SEQUENCE_READY": "ready",
    "CONTROL_SEQUENCE_CORRID": "corrid",
}
_TRITON_KINDS = {kind: name for name, kind in _KINDS.items()}
_FLAG_FIELDS = {"int32_false_true": "INT32", "fp32_false_true": "FP32", "bool_false_true": "BOOL"}
_V2_TYPES = {triton: name for name, triton in TRITON_CONFIG_TYPES.items()}


def sequence_from_triton(value: dict[str, Any], where: str) -> dict[str, Any]:
    """Triton's ``sequence_batching`` as the ``[sequence_batching]`` table."""
    table: dict[str, Any] = {}
    for key, field in value.items():
        here = f"{where}.{key}"
        if key == "max_sequence_idle_microseconds":
            table[key] = int(field)
        elif key == "iterative_sequence":
            table[key] = bool(field)
        elif key in ("direct", "oldest"):
            table["strategy"] = key
            table.update(_strategy(key, field or {}, here))
        elif key == "control_input":
            table[key] = [_control(item, f"{here}[{i}]") for i, item in enumerate(field)]
        elif key == "state":
            table[key] = [_state(item, f"{here}[{i}]") for i, item in enumerate(field)]
        else:
            raise ConfigError(f"{here}: not supported by reposerve")
    return table


def _strategy(name: str, value: dict[str, Any], where: str) -> dict[str, Any]:
    allowed = {
        "direct": ("max_queue_delay_microseconds",),
        "oldest": (
            "max_queue_delay_microseconds",
            "max_candidate_sequences",
            "preferred_batch_size",
        ),
    }[name]
    table: dict[str, Any] = {}
    for key, field in value.items():
        if key == "minimum_slot_utilization" and not field:
            continue
        if key == "preserve_ordering" and not field:
            continue
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: not supported by reposerve")
        table[key] = [int(size) for size in field] if key == "preferred_batch_size" else int(field)
    return table


def _control(item: dict[str, Any], where: str) -> dict[str, Any]:
    controls = item.get("control") or []
    unknown = set(item) - {"name", "control"}
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}: not supported by reposerve")
    if len(controls) != 1:
        raise ConfigError(f"{where}.control: give exactly one control per control input")
    control = controls[0]
    kind = _KINDS.get(control.get("kind", "CONTROL_SEQUENCE_START"))
    if kind is None:
        raise ConfigError(f"{where}.control[0].kind: '{control.get('kind')}' is not a control")
    table: dict[str, Any] = {"name": item.get("name", ""), "kind": kind}
    for key, field in control.items():
        if key in _FLAG_FIELDS and field:
            table["datatype"] = _FLAG_FIELDS[key]
            table["false_true"] = [float(v) if key == "fp32_false_true" else int(v) for v in field]
        elif key == "data_type":
            table["datatype"] = _v2_type(field, f"{where}.control[0].data_type")
        elif key != "kind" and field:
            raise ConfigError(f"{where}.control[0].{key}: not supported by reposerve")
    return table


def _state(item: dict[str, Any], where: str) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for key, field in item.items():
        if key in ("input_name", "output_name"):
            table[key] = field
        elif key == "data_type":
            table["datatype"] = _v2_type(field, f"{where}.{key}")
        elif key == "dims":
            table["shape"] = [int(dim) for dim in field]
        elif key == "initial_state":
            if len(field) > 1:
                raise ConfigError(f"{where}.initial_state: give at most one")
            if field:
                table[key] = _initial_state(field[0], f"{where}.initial_state[0]")
        elif key in ("use_same_buffer_for_input_output", "use_growable_memory"):
            continue  # how Triton's own buffers hold the state; reposerve copies it
        else:
            raise ConfigError(f"{where}.{key}: not supported by reposerve")
    table.setdefault("shape", [])
    return table


def _initial_state(item: dict[str, Any], where: str) -> dict[str, Any]:
    table: dict[str, Any] = {"shape": []}
    for key, field in item.items():
        if key == "data_type":
            table["datatype"] = _v2_type(field, f"{where}.{key}")
        elif key == "dims":
            table["shape"] = [int(dim) for dim in field]
        elif key == "data_file":
            table["data_file"] = field
        elif key not in ("zero_data", "name"):
            raise ConfigError(f"{where}.{key}: not supported by reposerve")
    return table


def _v2_type(value: str, where: str) -> str:
    name = _V2_TYPES.get(value)
    if name is None:
        raise ConfigError(f"{where}: '{value}' is not a datatype")
    return name


def sequence_to_triton(sequence: SequenceBatching) -> dict[str, Any]:
    """``sequence`` as Triton's ``sequence_batching`` JSON (what ``GET .../config`` shows)."""
    strategy: dict[str, Any] = {
        "max_queue_delay_microseconds": sequence.max_queue_delay_microseconds
    }
    if sequence.strategy == "oldest":
        strategy["max_candidate_sequences"] = sequence.max_candidate_sequences or 0
        strategy["preferred_batch_size"] = sequence.preferred_batch_size
        strategy["preserve_ordering"] = False
    else:
        strategy["minimum_slot_utilization"] = 0.0
    return {
        "max_sequence_idle_microseconds": sequence.max_sequence_idle_microseconds,
        sequence.strategy: strategy,
        "control_input": [
            {"name": control.name, "control": [_control_out(control)]}
            for control in sequence.control_input
        ],
        "state": [
            {
                "input_name": state.input_name,
                "output_name": state.output_name,
                "data_type": TRITON_CONFIG_TYPES[state.datatype],
                "dims": state.shape,
                "initial_state": []
                if state.initial_state is None
                else [
                    {
                        "data_type": TRITON_CONFIG_TYPES[state.initial_state.datatype],
                        "dims": state.initial_state.shape,
                        **(
                            {"data_file": state.initial_state.data_file}
                            if state.initial_state.data_file
                            else {"zero_data": True}
                        ),
                        "name": state.input_name,
                    }
                ],
            }
            for state in sequence.state
        ],
        "iterative_sequence": sequence.iterative_sequence,
    }


def _control_out(control: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": _TRITON_KINDS[control.kind]}
    if control.kind == "corrid":
        out["data_type"] = TRITON_CONFIG_TYPES[control.datatype]
        return out
    field = {name: kind for kind, name in _FLAG_FIELDS.items()}[control.datatype]
    false_true = control.false_true or [0, 1]
    out[field] = [bool(v) for v in false_true] if control.datatype == "BOOL" else false_true
    return out
