"""Stateful models for the sequence batching tests, written here.

``simple_sequence`` and ``simple_dyna_sequence`` compute what the models of those names in
Triton's docs compute (ONNX graphs built here: OUTPUT = (INPUT + START [+ END * CORRID]) *
READY), with the configs the docs give them, so Triton's client examples run against them.
``simple_string_dyna_sequence`` is the string-id model those examples ask for, a python
model on implicit state. The rest try one feature each.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from tests.toy_models import write_model

_CONTROLS = {
    "START": "CONTROL_SEQUENCE_START",
    "END": "CONTROL_SEQUENCE_END",
    "READY": "CONTROL_SEQUENCE_READY",
}


def _onnx_sequence(path: Path, with_corrid: bool) -> None:
    import onnx
    from onnx import TensorProto, helper

    int32 = TensorProto.INT32
    inputs = [helper.make_tensor_value_info(n, int32, ["b", 1]) for n in ("INPUT", "START")]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["started"])]
    total = "started"
    if with_corrid:
        inputs += [
            helper.make_tensor_value_info("END", int32, ["b", 1]),
            helper.make_tensor_value_info("CORRID", TensorProto.UINT64, ["b", 1]),
        ]
        nodes += [
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=int32),
            helper.make_node("Mul", ["END", "corrid"], ["ended"]),
            helper.make_node("Add", ["started", "ended"], ["total"]),
        ]
        total = "total"
    inputs.append(helper.make_tensor_value_info("READY", int32, ["b", 1]))
    nodes.append(helper.make_node("Mul", ["READY", total], ["OUTPUT"]))
    graph = helper.make_graph(
        nodes, "sequence", inputs, [helper.make_tensor_value_info("OUTPUT", int32, ["b", 1])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _control(name: str, corrid_type: str = "TYPE_UINT64") -> str:
    if name == "CORRID":
        control = f"kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type}"
    else:
        control = f"kind: {_CONTROLS[name]} int32_false_true: [ 0, 1 ]"
    return f'{{ name: "{name}" control [ {{ {control} }} ] }}'


_TENSORS = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def write_simple_sequence(root: Path, name: str = "simple_sequence", auto: bool = False) -> None:
    """Triton's docs' simple_sequence: direct strategy, START and READY. ``auto``: its
    tensors left to auto-complete from the model file."""
    _onnx_sequence(root / name / "1" / "model.onnx", with_corrid=False)
    controls = ",\n".join(_control(control) for control in ("START", "READY"))
    tensors = "" if auto else _TENSORS
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f"sequence_batching {{ control_input [ {controls} ] }}\n{tensors}"
        "instance_group [ { kind: KIND_CPU } ]\n"
    )


def write_simple_dyna_sequence(root: Path) -> None:
    """Triton's docs' simple_dyna_sequence: oldest strategy, every control, 2 instances."""
    _onnx_sequence(root / "simple_dyna_sequence" / "1" / "model.onnx", with_corrid=True)
    controls = ",\n".join(_control(name) for name in ("START", "END", "READY", "CORRID"))
    (root / "simple_dyna_sequence" / "config.pbtxt").write_text(
        'name: "simple_dyna_sequence"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "sequence_batching { max_sequence_idle_microseconds: 10000000 "
        "oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }\n"
        f"control_input [ {controls} ] }}\n{_TENSORS}"
        "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
    )


# The sum of the sequence's inputs so far (the state), plus the correlation id (a string
# that reads as an integer) on the request that ends it.
_STRING_DYNA = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            def value(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

            start, end = value("START")[0, 0], value("END")[0, 0]
            total = value("INPUT") + (0 if start else value("ACC"))
            corrid = int(value("CORRID")[0, 0].decode())
            assert request.correlation_id() == str(corrid)
            output = total + corrid if end else total
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", output.astype(np.int32)),
                pb_utils.Tensor("ACC_OUT", total.astype(np.int32)),
            ]))
        return responses
"""


def write_simple_string_dyna_sequence(root: Path) -> None:
    folder = root / "simple_string_dyna_sequence"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(_STRING_DYNA)
    controls = ",\n".join(_control(name) for name in ("START", "END", "READY"))
    corrid = (
        '{ name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }'
    )
    (folder / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        "sequence_batching { oldest { max_candidate_sequences: 64 } "
        f"control_input [ {controls}, {corrid} ]\n"
        'state [ { input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'
        f" }}\n{_TENSORS}"
    )


# Our own contract: the running sum of a sequence as implicit state (initial value from a
# file), and the instance's pid, to see a sequence stay on one instance.
_SUMS = """
    max_batch_size = 4
    [[input]]
    name = "INPUT"
    datatype = "FP32"
    shape = [1]
    [[output]]
    name = "SUM"
    datatype = "FP32"
    shape = [1]
"""
ACCUMULATE_CONFIG = (
    _SUMS.replace("{", "{{").replace("}", "}}")
    + """
    [[output]]
    name = "PID"
    datatype = "INT64"
    shape = [1]
    [[instance_group]]
    count = 2
    [sequence_batching]
    strategy = "{strategy}"
    max_sequence_idle_microseconds = {idle_us}
    {strategy_settings}
    [[sequence_batching.control_input]]
    name = "START"
    kind = "start"
    [[sequence_batching.state]]
    input_name = "SUM_IN"
    output_name = "SUM_OUT"
    datatype = "FP32"
    shape = [1]
    initial_state = {{ datatype = "FP32", shape = [1], data_file = "base" }}
    [[warmup]]  # its state and START, which no client sends, filled in too
    batch_size = 1
"""
)
ACCUMULATE = """
    import os
    import time
    import numpy as np

    class Model:
        def execute(self, inputs):
            time.sleep(0.002)
            total = inputs["SUM_IN"] + inputs["INPUT"]
            pid = np.full(total.shape, os.getpid(), np.int64)
            return {"SUM": total, "SUM_OUT": total, "PID": pid}
"""
ACCUMULATE_BASE = 1000.0  # the initial state's value, from the file


def write_accumulate(
    root: Path,
    name: str = "accumulate",
    strategy: str = "direct",
    idle_us: int = 5_000_000,
    strategy_settings: str = "",
) -> None:
    config = ACCUMULATE_CONFIG.format(
        strategy=strategy, idle_us=idle_us, strategy_settings=strategy_settings
    )
    folder = write_model(root, name, config, ACCUMULATE)
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "base").write_bytes(np.float32(ACCUMULATE_BASE).tobytes())


# A decoupled model that rescheduling drives: IN = n answers n-1, n-2, ..., 0, one per
# execute, the request handed back between them.
ITERATIVE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            key = id(request)
            if key not in self.left:
                self.left[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.left[key] -= 1
            out = pb_utils.Tensor("OUT", np.array([self.left[key]], np.int32))
            sender = request.get_response_sender()
            if self.left[key] <= 0:
                del self.left[key]
                sender.send(
                    pb_utils.InferenceResponse([out]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(pb_utils.InferenceResponse([out]))
        return None
"""
ITERATIVE_PBTXT = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching { iterative_sequence: true }
"""

# Hands its first request back once (returning None in its place), then answers it.
RESCHEDULE_ONCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.rounds = 0

    def execute(self, requests):
        self.rounds += 1
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if self.rounds == 1:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            rounds = np.full(x.shape, self.rounds, np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", rounds)]))
        return responses
"""
# Hands every request back and answers it all the same: a contradiction execute must not
# loop on.
RESCHEDULE_AND_ANSWER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return responses
"""
RESCHEDULE_PBTXT = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def write_python_pbtxt(root: Path, name: str, pbtxt: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(pbtxt))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))


# A model that calls accumulate (BLS) within the caller's sequence, and an ensemble whose
# one step is accumulate: a sequence reaches a stateful model through both.
BLS_ACCUMULATE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="accumulate",
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT")],
                requested_output_names=["SUM"],
                correlation_id=request.correlation_id(),
                flags=request.flags(),
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            total = pb_utils.get_output_tensor_by_name(answer, "SUM").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses
"""
BLS_ACCUMULATE_PBTXT = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
ENSEMBLE_ACCUMULATE = (
    'backend = "ensemble"\n'
    + _SUMS
    + """
    [[step]]
    model = "accumulate"
    input_map = { INPUT = "INPUT" }
    output_map = { SUM = "SUM" }
"""
)
