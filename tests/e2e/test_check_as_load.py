"""`reposerve check` refuses what a load refuses, in the same words: every rule a load
applies to a model folder before any instance process starts, each broken by one model,
walked through both.

The rules are found in the code, not listed by hand: every ``raise ConfigError(...)`` and
every problem a rule function returns in the modules a folder is read through must match
the message of some case below, or be exempt with the reason check cannot meet it
(``tests/rule_sites.py``). A new rule without a case fails ``test_every_rule_has_a_case``.
Model files are placeholders: scan reads their names only, and every case must fail before
anything opens them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import msgspec
import pytest

from reposerve.config.onnx_options import CudaOptions
from tests.rule_sites import breaks, exempt, rule_sites
from tests.server import REPO_ROOT, SERVE_BROKEN, running_server
from tests.toy_models import TEXT_IN_OUT, ensemble_head, vector_config

pytestmark = pytest.mark.e2e

PY = {"1/model.py": b""}
ONNX = {"1/model.onnx": b""}
SCRIPT = {"1/model.pt": b""}


class Rule(msgspec.Struct, frozen=True):
    """A model folder that breaks one rule, and the message both refuse it with: after
    ``NAME/<where>: `` (``NAME: `` when ``where`` is empty); ``<name>`` stands for the
    model's name, ``<model>`` for its folder's absolute path."""

    config: str | bytes | None  # the config file's content; None: no config file
    message: str
    files: dict[str, bytes] = msgspec.field(default_factory=lambda: PY)
    where: str = "config.toml"


BATCHED = textwrap.dedent(vector_config(size=4))  # INPUT and OUTPUT, FP32 [4]
LABELED = f'{BATCHED}label_filename = "labels.txt"\n'
ENSEMBLE = ensemble_head(8)  # IN and OUT, FP32 [4]


def step(reads: str, writes: str) -> str:
    return f'[[step]]\nmodel = "a"\ninput_map = {{ {reads} }}\noutput_map = {{ {writes} }}\n'


READ_IN = step('x = "IN"', 'y = "OUT"')
TEXT_INPUT = TEXT_IN_OUT.split("[[output]]")[0]
VECTOR = '[[output]]\nname = "vector"\ndatatype = "FP32"\nshape = [8]\n'


def openai(table: str, tensors: str = TEXT_IN_OUT, top: str = "") -> str:
    return f"{top}{tensors}[openai]\n{table}"


TENSORRT = "max_batch_size = 8\n[parameters.onnxruntime.tensorrt]\n"


def profiles(*shapes: str) -> str:
    """TensorRT's min, opt and max profiles, as many as given, each ``x = [...]``."""
    kinds = ("min", "opt", "max")
    return TENSORRT + "".join(
        f"trt_profile_{kind}_shapes = {{ {shape} }}\n"
        for kind, shape in zip(kinds, shapes, strict=False)
    )


PBTXT_TENSORS = (
    'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)


def pbtxt(text: str, files: dict[str, bytes] = PY) -> Rule:
    """A config.pbtxt case; ``message`` is set by ``refuses``."""
    return Rule(text, "", files, "config.pbtxt")


def warmup(sample: str, key: str = "x") -> str:
    return (
        f"max_batch_size: 8\n{PBTXT_TENSORS}model_warmup [ {{ batch_size: 1 inputs {{ key: "
        f'"{key}" value: {{ {sample} }} }} }} ]'
    )


def accelerator(side: str, text: str) -> str:
    return (
        f"optimization {{ execution_accelerators {{ {side}_execution_accelerator [ {text} ] }} }}"
    )


def trt(key: str, value: str) -> str:
    return accelerator(
        "gpu", f'{{ name: "tensorrt" parameters {{ key: "{key}" value: "{value}" }} }}'
    )


def parameter(key: str, value: str, backend: str = "onnxruntime") -> str:
    return (
        f'backend: "{backend}"\nparameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
    )


def refuses(case: Rule, message: str) -> Rule:
    return msgspec.structs.replace(case, message=message)


ALLOWED = f"allowed: {', '.join(CudaOptions.__struct_fields__)}"
SERVED = "python, onnxruntime/onnxruntime_onnx, pytorch/pytorch_libtorch, ensemble"
MODEL_FILES = "model.py, model.onnx, model.pt, model.pt2"
KNOWN = (
    "reposerve.optimization.precision, reposerve.execution.timeout_seconds, "
    "reposerve.execution.isolate_failures, reposerve.lifecycle.pinned, "
    "reposerve.instance_group.<i>.cpus, reposerve.dynamic_batching.{pad,buckets,lengths_input,"
    "lengths_datatype,unpad}, reposerve.openai.{kind,chat_template,input,output,max_tokens}"
)
RULES: dict[str, Rule] = {
    # The file and the schema (config.load, config.validate, config.tables)
    "toml_syntax": Rule(
        "max_batch_size = \n[x]", "invalid TOML: Invalid value (at line 1, column 18)"
    ),
    "not_utf8": Rule(b"\xff", "not UTF-8 text: invalid start byte"),
    "unknown_key": Rule("max_batch_sise = 8", "max_batch_sise: unknown key"),
    "wrong_type": Rule('max_batch_size = "8"', "max_batch_size: expected int, got str"),
    "negative": Rule(
        "max_batch_size = 8\n[dynamic_batching]\nmax_queue_delay_microseconds = -5",
        "dynamic_batching.max_queue_delay_microseconds: expected int >= 0, got -5",
    ),
    "unknown_backend": Rule('backend = "tensorflow"', "backend: invalid enum value 'tensorflow'"),
    "missing_key": Rule(
        '[[input]]\nname = "x"\ndatatype = "FP32"', "input[0].shape: required key is missing"
    ),
    # Rules across fields (config.validate)
    "name_mismatch": Rule(
        'name = "other"', 'name: "other" does not match the model folder "name_mismatch"'
    ),
    "two_policies": Rule(
        "version_policy = { latest = 1, all = true }",
        "version_policy: set one of latest, all, specific (got latest, all)",
    ),
    "all_false": Rule(
        "version_policy = { all = false }",
        "version_policy.all: must be true when given (use latest or specific instead)",
    ),
    "duplicate": Rule(
        BATCHED + '[[output]]\nname = "OUTPUT"\ndatatype = "FP32"\nshape = [4]',
        'output[1].name: duplicate output "OUTPUT"',
    ),
    "input_labels": Rule(
        BATCHED.replace("shape = [4]", 'shape = [4]\nlabel_filename = "l.txt"', 1),
        "input[0].label_filename: only outputs have class labels",
    ),
    "reshape_wildcards": Rule(
        BATCHED.replace("shape = [4]", "shape = [-1]\nreshape = [-1, -1]", 1),
        "input[0].reshape: [-1, -1]: at most one -1 (the rest of the elements)",
    ),
    "reshape_variable": Rule(
        BATCHED.replace("shape = [4]", "shape = [4]\nreshape = [-1]", 1),
        "input[0].reshape: [-1]: variable-size only where shape [4] is too",
    ),
    "reshape_elements": Rule(
        f"{BATCHED}reshape = [3]", "output[0].reshape: [3] holds 3 elements, shape [4] holds 4"
    ),
    "cpu_gpus": Rule(
        "[[instance_group]]\ngpus = [0]",
        'instance_group[0].gpus: a kind = "cpu" group runs on no GPU. Hint: remove gpus, or '
        'use kind = "gpu" (or "auto")',
    ),
    "model_gpus": Rule(
        '[[instance_group]]\nkind = "model"\ngpus = [0]',
        'instance_group[0].gpus: a kind = "model" group picks its own device. Hint: remove '
        'gpus, or use kind = "gpu"',
    ),
    "unbatched": Rule(
        "[dynamic_batching]",
        "dynamic_batching: needs max_batch_size > 0 (0 means no batch dimension)",
    ),
    "preferred": Rule(
        "max_batch_size = 8\n[dynamic_batching]\npreferred_batch_size = [4, 16]",
        "dynamic_batching.preferred_batch_size: 16 exceeds max_batch_size 8",
    ),
    "priority": Rule(
        "max_batch_size = 8\n[dynamic_batching]\npriority_levels = 2\ndefault_priority_level = 3",
        "dynamic_batching.default_priority_level: 3 exceeds priority_levels 2",
    ),
    "warmup_batch": Rule(
        "max_batch_size = 4\n[[warmup]]\nbatch_size = 5",
        "warmup[0].batch_size: 5 exceeds the limit 4",
    ),
    "warmup_input": Rule(
        f'{BATCHED}[[warmup]]\ninputs = {{ NOPE = "zero" }}',
        'warmup[0].inputs: "NOPE" is not an input of this model',
    ),
    # An ensemble's steps (config.ensemble)
    "steps_elsewhere": Rule(
        BATCHED + READ_IN, 'step: only an ensemble has steps. Hint: set backend = "ensemble"'
    ),
    "ensemble_no_steps": Rule(ENSEMBLE, "step: an ensemble needs at least one step"),
    "ensemble_no_tensors": Rule(
        f'backend = "ensemble"\n{READ_IN}',
        "input, output: an ensemble declares the tensors it takes and gives",
    ),
    "ensemble_optional": Rule(
        ENSEMBLE.replace("shape = [4]", "shape = [4]\noptional = true", 1) + READ_IN,
        "input[0].optional: an ensemble's inputs are all required",
    ),
    "ensemble_groups": Rule(
        f"{ENSEMBLE}{READ_IN}[[instance_group]]",
        "instance_group: an ensemble has none (each step model has its own)",
    ),
    "ensemble_warmup": Rule(
        f"{ENSEMBLE}{READ_IN}[[warmup]]", "warmup: not supported for an ensemble"
    ),
    "ensemble_writes_input": Rule(
        ENSEMBLE + step('x = "IN"', 'y = "IN"'),
        'step[0].output_map: "IN" is an ensemble input',
    ),
    "ensemble_two_writers": Rule(
        ENSEMBLE + READ_IN + READ_IN,
        'step[1].output_map: "OUT" is written by step[0] already; each tensor has one writer',
    ),
    "ensemble_writes_nothing": Rule(
        ENSEMBLE + step('x = "IN"', ""),
        "step[0].output_map: a step must write at least one tensor",
    ),
    "ensemble_reads_unknown": Rule(
        ENSEMBLE + step('x = "MID"', 'y = "OUT"'),
        'step[0].input_map.x: "MID" is neither an ensemble input nor written by a step',
    ),
    "ensemble_unwritten": Rule(
        ENSEMBLE + step('x = "IN"', 'y = "MID"'), 'output: "OUT" is written by no step'
    ),
    "ensemble_unread": Rule(
        ENSEMBLE + step('x = "MID"', 'y = "OUT"') + step('x = "OUT"', 'y = "MID"'),
        'input: "IN" is read by no step',
    ),
    "ensemble_cycle": Rule(
        ENSEMBLE
        + step('x = "IN", z = "B"', 'y = "A"')
        + step('x = "A"', 'y = "B"')
        + step('x = "A"', 'y = "OUT"'),
        "step: the steps form a cycle: step[0] -> step[1] -> step[0]",
    ),
    # [parameters] and what the backend supports (config.parameters, onnx_options,
    # torch_options), the backend named or told by the model file
    "onnx_bf16": Rule(
        'max_batch_size = 8\n[optimization]\nprecision = "bf16"',
        "optimization.precision: bf16 is not supported by the onnxruntime backend. "
        "Hint: use fp16 or fp32",
        ONNX,
    ),
    "onnx_bf16_named": Rule(
        'backend = "onnxruntime"\n[optimization]\nprecision = "bf16"',
        "optimization.precision: bf16 is not supported by the onnxruntime backend. "
        "Hint: use fp16 or fp32",
        ONNX,
    ),
    "cuda_typo": Rule(
        '[parameters.onnxruntime.cuda]\ncudnn_conv_algo_serch = "HEURISTIC"',
        f"parameters.onnxruntime.cuda.cudnn_conv_algo_serch: unknown key ({ALLOWED})",
        ONNX,
    ),
    "provider_typo": Rule(
        "[parameters.onnxruntime.rocm]",
        "parameters.onnxruntime.rocm: unknown key (allowed: cuda, tensorrt)",
        ONNX,
    ),
    "trt_wrong_type": Rule(
        f'{TENSORRT}trt_fp16_enable = "yes"',
        "parameters.onnxruntime.tensorrt.trt_fp16_enable: expected bool, got str",
        ONNX,
    ),
    "trt_switch": Rule(
        '[parameters]\ntensorrt = "yes"', "parameters.tensorrt: expected bool, got str", ONNX
    ),
    "trt_switched_off": Rule(
        "[parameters]\ntensorrt = false\n[parameters.onnxruntime.tensorrt]\ntrt_fp16_enable = true",
        "parameters.onnxruntime.tensorrt: TensorRT options given while parameters.tensorrt = "
        "false. Hint: remove one of them",
        ONNX,
    ),
    "trt_profiles": Rule(
        profiles("x = [1, 4]"),
        "parameters.onnxruntime.tensorrt.trt_profile_min_shapes: needs "
        "trt_profile_opt_shapes, trt_profile_max_shapes too (TensorRT takes the three together)",
        ONNX,
    ),
    "trt_profile_names": Rule(
        profiles("x = [1, 4]", "y = [8, 4]", "x = [32, 4]"),
        "parameters.onnxruntime.tensorrt.trt_profile_opt_shapes: names ['y'], "
        "trt_profile_min_shapes ['x']",
        ONNX,
    ),
    "trt_profile_rank": Rule(
        profiles("x = [1, 4]", "x = [8]", "x = [32, 4]"),
        "parameters.onnxruntime.tensorrt.trt_profile_*_shapes.x: the three shapes differ in rank",
        ONNX,
    ),
    "trt_profile_order": Rule(
        profiles("x = [8, 4]", "x = [1, 4]", "x = [32, 4]"),
        "parameters.onnxruntime.tensorrt.trt_profile_*_shapes.x: expected min <= opt <= max in "
        "every dimension, got [8, 4], [1, 4], [32, 4]",
        ONNX,
    ),
    "torch_tf32": Rule(
        f'{BATCHED}[parameters]\nallow_tf32 = "yes"',
        "parameters.allow_tf32: expected bool, got str",
        SCRIPT,
    ),
    "torch_compile_key": Rule(
        f"{BATCHED}[parameters]\ntorch_compile = {{ fullgraph = true }}",
        "parameters.torch_compile.fullgraph: unknown key (allowed: mode, dynamic, backend)",
        SCRIPT,
    ),
    "script_undeclared": Rule(
        "max_batch_size = 8",
        "input, output: TorchScript files carry no tensor names or shapes; declare [[input]] "
        "and [[output]] in config.toml (or export with torch.export to model.pt2)",
        SCRIPT,
    ),
    "script_compiled": Rule(
        f"{BATCHED}[parameters]\ntorch_compile = true",
        "parameters.torch_compile: torch.compile cannot compile TorchScript (model.pt). "
        "Hint: export the model with torch.export to model.pt2",
        SCRIPT,
    ),
    "inflight": Rule(
        f"{BATCHED}[parameters]\nmax_inflight_batches = 1.5",
        "parameters.max_inflight_batches: expected int, got float",
    ),
    "staging": Rule(
        f'{BATCHED}[parameters]\nstage_next_batch = "no"',
        "parameters.stage_next_batch: expected bool, got str",
    ),
    "threads": Rule(
        f"{BATCHED}[parameters]\nintra_op_threads = 0",
        "parameters.intra_op_threads: expected int >= 1, got 0",
    ),
    # The folder: versions, model files (repository.scan)
    "no_versions": Rule(BATCHED, "no version folders. Hint: put the model in <name>/1/", {}, ""),
    "specific_missing": Rule(
        f"version_policy = {{ specific = [2] }}\n{BATCHED}",
        "version_policy.specific: no folder for version(s) 2",
    ),
    "python_missing": Rule(
        f'backend = "python"\n{BATCHED}',
        "backend python needs model.py (Failed to preinitialize Python stub: Python model file "
        "not found in '<model>/1/model.py')",
        ONNX,
        "1",
    ),
    "onnx_missing": Rule(
        'backend = "onnxruntime"', "backend onnxruntime needs model.onnx", PY, "1"
    ),
    "several_files": Rule(
        BATCHED,
        f"several model files; put exactly one of {MODEL_FILES} there or set the backend in "
        "its config",
        PY | ONNX,
        "1",
    ),
    "no_model_file": Rule(
        BATCHED,
        f"no model file; put exactly one of {MODEL_FILES} there or set the backend in its config",
        {"1/notes.txt": b""},
        "1",
    ),
    "named_missing": Rule(
        f'default_model_filename = "net.onnx"\n{BATCHED}',
        "no net.onnx (the config's default_model_filename)",
        ONNX,
        "1",
    ),
    "named_unknown": Rule(
        f'default_model_filename = "net.bin"\n{BATCHED}',
        "cannot tell the backend of net.bin from its name. Hint: set the backend (or Triton's "
        "platform) in the config",
        {"1/net.bin": b""},
        "1",
    ),
    "no_config": Rule(
        None,
        "missing. Hint: every model folder needs one (or Triton's config.pbtxt); only an ONNX "
        "model (N/model.onnx) or a python model whose auto_complete_config fills it in "
        "(N/model.py) may go without",
        SCRIPT,
    ),
    # The OpenAI-compatible routes (config.openai)
    "openai_template_kind": Rule(
        openai('kind = "completion"\nchat_template = "t.jinja"\n'),
        'openai.chat_template: only a kind = "chat" model has one (this is "completion")',
    ),
    "openai_no_text_input": Rule(
        openai('kind = "embedding"\n', BATCHED),
        "openai.input: name the input that takes the text (the model has no BYTES input to "
        "take by default)",
    ),
    "openai_which_output": Rule(
        openai('kind = "embedding"\n', TEXT_IN_OUT + VECTOR),
        "openai.output: name the output that holds the vector (the model has several)",
    ),
    "openai_undeclared": Rule(
        openai('kind = "completion"\noutput = "nope"\n'),
        'openai.output: "nope" is not a declared output (declared: text_output). Hint: set '
        "openai.output to the one to use",
    ),
    "openai_datatype": Rule(
        openai('kind = "embedding"\n'),
        'openai.output: output "text_output" is BYTES; the embedding routes need FP16 or FP32 '
        "or FP64 or BF16",
    ),
    "openai_several_texts": Rule(
        openai('kind = "embedding"\n', TEXT_INPUT.replace("[1]", "[2]") + VECTOR),
        'openai.input: input "text_input" holds one text per request, so its shape has no dim '
        "but 1 and -1 (it is [2])",
    ),
    "openai_decoupled_embedding": Rule(
        openai('kind = "embedding"\n', TEXT_INPUT + VECTOR, "decoupled = true\n"),
        'openai.kind: an "embedding" model answers each text once; this model is decoupled '
        "(it streams responses)",
    ),
    "openai_template_missing": Rule(
        openai('kind = "chat"\nchat_template = "t.jinja"\n'),
        'openai.chat_template: "t.jinja" does not exist in the model folder',
    ),
    "openai_template_unreadable": Rule(
        openai('kind = "chat"\nchat_template = "t.jinja"\n'),
        "openai.chat_template: cannot read \"t.jinja\": 'utf-8' codec can't decode byte 0xff "
        "in position 0: invalid start byte",
        PY | {"t.jinja": b"\xff{{ messages }}"},
    ),
    "openai_template_broken": Rule(
        openai('kind = "chat"\nchat_template = "t.jinja"\n'),
        "openai.chat_template: the chat template does not compile: line 1: tag name expected",
        PY | {"t.jinja": b"{% %}"},
    ),
    "openai_no_template": Rule(
        openai('kind = "chat"\n'),
        'openai: a kind = "chat" model needs a chat template: set openai.chat_template to a '
        "Jinja file in the model folder, or put a Hugging Face tokenizer_config.json with a "
        "chat_template there",
    ),
    "openai_tokenizer_config_broken": Rule(
        openai('kind = "chat"\n'),
        "openai: cannot read tokenizer_config.json: JSON is malformed: invalid character (byte 4)",
        PY | {"tokenizer_config.json": b"nope"},
    ),
    "openai_tokenizer_config_list": Rule(
        openai('kind = "chat"\n'),
        "openai: tokenizer_config.json is not a JSON object",
        PY | {"tokenizer_config.json": b"[]"},
    ),
    # Class labels (config.labels)
    "labels_missing": Rule(
        LABELED, 'output[0].label_filename: "labels.txt" does not exist in the model folder'
    ),
    "labels_short": Rule(
        LABELED,
        "output[0].label_filename: \"labels.txt\" has 2 lines, but output 'OUTPUT' has 4 "
        "classes. Hint: one label per line, in class order",
        PY | {"labels.txt": b"a\nb\n"},
    ),
    "labels_outside": Rule(
        LABELED.replace("labels.txt", "../labels.txt"),
        'output[0].label_filename: "../labels.txt" must be a file inside the model folder',
    ),
    "labels_binary": Rule(
        LABELED,
        'output[0].label_filename: "labels.txt" is not UTF-8 text: invalid start byte',
        PY | {"labels.txt": b"\xff\n"},
    ),
    # Triton's config.pbtxt (config.pbtxt, config.triton, config.triton_parameters)
    "pbtxt_syntax": refuses(
        pbtxt('max_batch_size: "x"'),
        '1:17 : \'max_batch_size: "x"\': Couldn\'t parse integer: "x"',
    ),
    "pbtxt_field": refuses(
        pbtxt("response_cache { enable: true }"),
        "1:1: response_cache: not supported by reposerve (or not a Triton ModelConfig field)",
    ),
    "pbtxt_platform": refuses(
        pbtxt('platform: "tensorrt_plan"'),
        f"platform: 'tensorrt_plan' is not served by reposerve (it serves: {SERVED})",
    ),
    "pbtxt_contradiction": refuses(
        pbtxt('platform: "onnxruntime_onnx"\nbackend: "python"'),
        "backend: 'python' contradicts the platform/backend given before it",
    ),
    "pbtxt_tensor_field": refuses(
        pbtxt('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] is_shape_tensor: true } ]'),
        "input[0].is_shape_tensor: not supported by reposerve",
    ),
    "pbtxt_timeout_action": refuses(
        pbtxt(
            "max_batch_size: 8\ndynamic_batching { default_queue_policy { timeout_action: DELAY } }"
        ),
        "dynamic_batching.default_queue_policy.timeout_action: DELAY is not supported (REJECT is)",
    ),
    "pbtxt_warmup_file": refuses(
        pbtxt(warmup('data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "f"')),
        "model_warmup[0].inputs.x: only zero_data and random_data are supported",
    ),
    "pbtxt_warmup_input": refuses(
        pbtxt(warmup("data_type: TYPE_FP32 dims: [ 4 ] zero_data: true", key="z")),
        "model_warmup[0].inputs.z: the model has no input 'z'",
    ),
    "pbtxt_warmup_type": refuses(
        pbtxt(warmup("data_type: TYPE_INT32 dims: [ 4 ] zero_data: true")),
        "model_warmup[0].inputs.x.data_type: TYPE_INT32, but the input is FP32",
    ),
    "pbtxt_warmup_dims": refuses(
        pbtxt(warmup("data_type: TYPE_FP32 dims: [ 5 ] zero_data: true")),
        "model_warmup[0].inputs.x.dims: [5]: reposerve warms inputs up at their shape with -1 "
        "as 1 ([4])",
    ),
    "pbtxt_cpu_accelerator": refuses(
        pbtxt(accelerator("cpu", '{ name: "openvino" }'), ONNX),
        "optimization.execution_accelerators.cpu_execution_accelerator[0]: only the GPU "
        "accelerator tensorrt is supported",
    ),
    "pbtxt_trt_precision": refuses(
        pbtxt(trt("precision_mode", "INT8"), ONNX),
        "optimization.execution_accelerators.gpu_execution_accelerator[0].parameters."
        "precision_mode: INT8 is not supported",
    ),
    "pbtxt_trt_parameter": refuses(
        pbtxt(trt("minimum_segment_size", "3"), ONNX),
        "optimization.execution_accelerators.gpu_execution_accelerator[0].parameters."
        "minimum_segment_size: not supported by reposerve",
    ),
    "pbtxt_namespace": refuses(
        pbtxt(
            f'platform: "ensemble"\n{PBTXT_TENSORS}ensemble_scheduling {{ step [ {{ '
            'model_name: "a" input_map { key: "x" value: "x" } output_map { key: "y" value: '
            '"y" } model_namespace: "n" } ] }',
            {},
        ),
        "ensemble_scheduling.step[0].model_namespace: not supported by reposerve",
    ),
    "pbtxt_triton_only": refuses(
        pbtxt(parameter("enable_mem_arena", "1"), ONNX),
        "parameters.enable_mem_arena: Triton's onnxruntime backend reads it; reposerve does not",
    ),
    "pbtxt_triton_value": refuses(
        pbtxt(parameter("cudnn_conv_algo_search", "7"), ONNX),
        "parameters.cudnn_conv_algo_search: not a value Triton accepts (tuple index out of range)",
    ),
    "pbtxt_reposerve_setting": refuses(
        pbtxt(parameter("reposerve.nope", "1", "python")),
        f"parameters.reposerve.nope: unknown reposerve setting (known: {KNOWN})",
    ),
    "pbtxt_reposerve_group": refuses(
        pbtxt(parameter("reposerve.instance_group.3.cpus", "[0]", "python")),
        "parameters.reposerve.instance_group.3.cpus: there is no instance_group[3] "
        "(0 group(s) given)",
    ),
}


def _expected(repository: Path, name: str, rule: Rule) -> str:
    message = rule.message.replace("<name>", name).replace(
        "<model>", str((repository / name).resolve())
    )
    return f"{name}/{rule.where}: {message}" if rule.where else f"{name}: {message}"


def _write(repository: Path) -> dict[str, str]:
    """Every case's folder; model name -> the message both must refuse it with."""
    for name, rule in RULES.items():
        folder = repository / name
        folder.mkdir()
        if rule.config is not None:
            file = "config.pbtxt" if rule.where == "config.pbtxt" else "config.toml"
            content = rule.config.encode() if isinstance(rule.config, str) else rule.config
            (folder / file).write_bytes(content)
        for path, content in rule.files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_bytes(content)
    return {name: _expected(repository, name, rule) for name, rule in RULES.items()}


def test_every_rule_has_a_case(tmp_path):
    expected = _write(tmp_path)
    missing = [
        f"{module}:{line} {function}: {pattern}"
        for module, function, line, pattern in rule_sites()
        if not exempt(module, function, pattern)
        and not any(breaks(pattern, message) for message in expected.values())
    ]
    assert not missing, "rules no case breaks:\n" + "\n".join(missing)


def test_check_and_load_refuse_the_same_configs_in_the_same_words(repository, tmp_path):
    expected = _write(repository)
    result = subprocess.run(
        [sys.executable, "-m", "reposerve", "check", str(repository)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [f"FAIL {expected[name]}" for name in sorted(RULES)]
    with running_server(
        repository, tmp_path, "--model-control-mode=explicit", *SERVE_BROKEN
    ) as server:
        refused = {}
        for name in RULES:
            reply = httpx.post(f"{server.url}/v2/repository/models/{name}/load", timeout=120)
            assert reply.status_code == 400, reply.text
            refused[name] = reply.json()["error"]
        assert refused == expected
        # The index gives each the same reason, and no instance process ever started.
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        assert {entry["name"]: entry.get("reason") for entry in index} == expected
        assert server.instance_pids() == []
