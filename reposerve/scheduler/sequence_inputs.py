"""What a sequence-batched model reads of its sequence beside a request's own inputs: the
control inputs (START, END, READY, CORRID) and, with implicit state, the state the
sequence's previous request returned, or the initial state (Triton's
``sequence_batching.control_input`` and ``state``). The state is copied out of each
answer, so no slot is held between a sequence's requests.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from reposerve.config import ModelConfig
from reposerve.config.confined import inside_model_folder
from reposerve.config.schema import ControlInput, SequenceState
from reposerve.datatypes import NUMPY_DTYPES, element_count, pack_bytes
from reposerve.errors import ConfigError, InstanceError
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.lease import Lease
from reposerve.tensor import Tensor

State = dict[str, Tensor]  # one sequence's implicit state, by the model's input name


class SequenceInputs:
    def __init__(self, label: str, config: ModelConfig, folder: Path | None) -> None:
        sequence = config.sequence_batching
        assert sequence is not None
        self._label = label
        self._sequence = sequence
        self._batched = config.max_batch_size > 0
        self._folder = folder
        self._initial: State = {}  # read by ``load_initial_state``
        self._state_outputs = [state.output_name for state in sequence.state]

    def load_initial_state(self) -> None:
        """Read each state's initial value (a file's, for some) before requests come."""
        self._initial = {
            state.input_name: _initial(state, index, self._folder, self._label)
            for index, state in enumerate(self._sequence.state)
        }

    def prepared(self, state: State, request: InferRequest) -> InferRequest:
        """``request`` with its sequence's controls and ``state`` (the initial state
        where it has none yet) added to its inputs."""
        rows = request.batch_size
        inputs = dict(request.inputs)
        for control in self._sequence.control_input:
            inputs[control.name] = self._control(control, request, rows)
        for kept in self._sequence.state:
            inputs[kept.input_name] = state.get(kept.input_name) or self._rows(
                self._initial[kept.input_name], rows
            )
        outputs = request.outputs
        if outputs is not None and self._state_outputs:
            outputs = {**outputs, **{name: None for name in self._state_outputs}}
        # Its sequence has its slot: a timeout no longer counts, and one left to the
        # lane's queue could drop a request from the middle of the sequence.
        return msgspec.structs.replace(request, inputs=inputs, outputs=outputs, timeout_us=0)

    def keep_state(self, state: State, lease: Lease) -> None:
        """Copy the state the model returned into ``state``, for the sequence's next
        request (the lease is released when the model returned none)."""
        for kept in self._sequence.state:
            tensor = lease.outputs.get(kept.output_name)
            if tensor is None:
                lease.release()
                raise InstanceError(
                    f"{self._label}: the model returned no state output '{kept.output_name}'"
                )
            state[kept.input_name] = Tensor(tensor.datatype, tensor.shape, bytes(tensor.memory()))

    def _control(self, control: ControlInput, request: InferRequest, rows: int) -> Tensor:
        shape = (rows, 1) if self._batched else (1,)
        count = element_count(shape)
        if control.kind == "corrid":  # the batcher made the id the form the control holds
            value: int | str | float = request.sequence_id
            if control.datatype == "BYTES":
                return Tensor("BYTES", shape, pack_bytes([str(value).encode()] * count))
        else:
            flag = {
                "start": request.sequence_start,
                "end": request.sequence_end,
                "ready": True,
            }[control.kind]
            value = (control.false_true or [0, 1])[int(flag)]
        data = np.full(shape, value, dtype=NUMPY_DTYPES[control.datatype])
        return Tensor(control.datatype, shape, data.tobytes())

    def _rows(self, state: Tensor, rows: int) -> Tensor:
        """The initial state, with the request's batch dimension when the model has one."""
        if not self._batched:
            return state
        shape = (rows, *state.shape)
        return Tensor(state.datatype, shape, bytes(state.memory()) * rows)


def _initial(state: SequenceState, index: int, folder: Path | None, label: str) -> Tensor:
    """A state's value on a sequence's first request: its initial_state (zeros, or the
    file's values), else zeros with 1 for each variable dimension, as in Triton."""
    initial = state.initial_state
    shape = tuple(initial.shape if initial is not None else (max(dim, 1) for dim in state.shape))
    dtype = NUMPY_DTYPES[state.datatype]
    count = element_count(shape)
    if state.datatype == "BYTES":
        return Tensor("BYTES", shape, pack_bytes([b""] * count))
    if initial is None or initial.data_file is None:
        return Tensor(state.datatype, shape, bytes(count * dtype.itemsize))
    key = f"{label}: sequence_batching.state[{index}].initial_state.data_file"
    if folder is None:
        raise ConfigError(f"{key}: '{initial.data_file}' needs the model's folder")
    # Triton reads <model>/initial_state/<data_file>; it stays inside the model folder as
    # a label file does (a symlink out is refused), so nothing outside is read or sized.
    name = f"initial_state/{initial.data_file}"
    path = inside_model_folder(folder, name, key)
    needed = count * dtype.itemsize
    try:
        size = path.stat().st_size
        data = path.read_bytes() if size == needed else b""  # read only what it must hold
    except FileNotFoundError:
        raise ConfigError(f'{key}: "{name}" does not exist in the model folder') from None
    except OSError as exc:
        raise ConfigError(f'{key}: cannot read "{name}": {exc.strerror}') from None
    if len(data) != needed:
        raise ConfigError(
            f'{key}: "{name}" holds {size} bytes; initial state {list(shape)} of '
            f"{state.datatype} needs {needed}"
        )
    return Tensor(state.datatype, shape, data)
