"""Triton's model configuration <-> reposerve's, both directions in one place.

In: Triton's configuration as its JSON shows it (field names as in the protobuf; 64-bit
integers may be strings, as protobuf's JSON writes them), from a ``config.pbtxt`` (``pbtxt``)
or a load's JSON config (``triton_json``), becomes the same table a ``config.toml`` would
hold, validated by the same rules. What has no equivalent in reposerve is an error naming
the field, never dropped: a model must not silently behave differently from the way its
author configured it for Triton.

Out: ``to_triton`` writes a ModelConfig as Triton's model-config JSON (``GET .../config``),
every field one of Triton's ``ModelConfig``, so its tools parse it strictly and a load may
send it back. Settings Triton has no field for travel in its ``parameters`` map, both ways
(``triton_parameters``). Backend names and backend parameters come from ``backends``.
"""

from __future__ import annotations

import re
from typing import Any

from reposerve.config.backends import BACKENDS, backend_entry
from reposerve.config.schema import ModelConfig, TensorConfig
from reposerve.config.sequences import sequence_from_triton, sequence_to_triton
from reposerve.config.triton_parameters import apply_triton_parameters, to_triton_parameters
from reposerve.config.validate import validate_model_config
from reposerve.datatypes import TRITON_CONFIG_TYPES
from reposerve.errors import ConfigError

_KINDS = {"KIND_AUTO": "auto", "KIND_GPU": "gpu", "KIND_CPU": "cpu", "KIND_MODEL": "model"}
_POSITIONAL = re.compile(r"^.+__(\d+)$")  # Triton's libtorch naming: INPUT__0, OUTPUT__1


def config_from_triton(
    document: dict[str, Any], label: str, folder_name: str | None = None
) -> ModelConfig:
    """Triton's configuration (protobuf field names) as a ModelConfig, checked like a
    config.toml: the fields by ``from_triton``, then the parameters map (reposerve's own
    settings, the model's ``[parameters]``, Triton's backend parameters)."""
    document = dict(document)
    parameters = document.pop("parameters", None) or {}
    if not isinstance(parameters, dict):
        raise ConfigError(f"{label}: parameters: expected an object of {{key: string_value}}")
    table = from_triton(document, label)
    apply_triton_parameters(table, parameters, label)
    backend_parameters(table, label)
    return validate_model_config(table, label, folder_name)


def from_triton(document: dict[str, Any], label: str) -> dict[str, Any]:
    """The config.toml table equivalent to Triton's configuration ``document``, but for its
    ``parameters`` map, which ``config_from_triton`` reads."""
    table: dict[str, Any] = {}
    for key, value in document.items():
        convert = _FIELDS.get(key)
        if convert is None:
            raise ConfigError(f"{label}: {key}: not supported by reposerve")
        convert(table, value, f"{label}: {key}")
    backend = table.get("backend")
    if backend is not None and backend_entry(backend).positional_names:
        for section in ("input", "output"):
            table[section] = _positional_order(table.get(section, []))
    return table


def backend_parameters(table: dict[str, Any], label: str) -> None:
    """Triton's own parameters of the backend in ``table["parameters"]`` as reposerve's
    equivalents; one reposerve has none for is an error naming it, never ignored."""
    backend = table.get("backend")
    if backend is None:
        return
    entry = backend_entry(backend)
    parameters = table.get("parameters") or {}
    for key in list(parameters):
        where = f"{label}: parameters.{key}"
        if key in entry.triton_only:
            raise ConfigError(f"{where}: Triton's {backend} backend reads it; reposerve does not")
        mapping = entry.triton_parameters.get(key)
        if mapping is None:
            continue
        try:
            value = mapping.convert(parameters.pop(key))
        except (ValueError, IndexError, TypeError) as exc:
            raise ConfigError(f"{where}: not a value Triton accepts ({exc})") from exc
        target = parameters
        for part in mapping.path:
            target = target.setdefault(part, {})
        target[mapping.key] = value


def _name(table: dict[str, Any], value: str, where: str) -> None:
    table["name"] = value


_TRITON_NAMES = {name: entry.name for entry in BACKENDS for name in entry.triton_names}


def _backend(table: dict[str, Any], value: str, where: str) -> None:
    if not value:
        return
    backend = _TRITON_NAMES.get(value)
    if backend is None:
        served = ", ".join("/".join(entry.triton_names) for entry in BACKENDS)
        raise ConfigError(f"{where}: '{value}' is not served by reposerve (it serves: {served})")
    if table.setdefault("backend", backend) != backend:
        raise ConfigError(f"{where}: '{value}' contradicts the platform/backend given before it")


def _max_batch_size(table: dict[str, Any], value: int, where: str) -> None:
    table["max_batch_size"] = int(value)


def _tensors(section: str) -> Any:
    def convert(table: dict[str, Any], value: list[dict[str, Any]], where: str) -> None:
        table[section] = [_tensor(item, f"{where}[{index}]") for index, item in enumerate(value)]

    return convert


def _tensor(item: dict[str, Any], where: str) -> dict[str, Any]:
    tensor: dict[str, Any] = {}
    for key, value in item.items():
        if key == "name":
            tensor["name"] = value
        elif key == "data_type":
            tensor["datatype"] = _datatype(value, f"{where}.data_type")
        elif key == "dims":
            tensor["shape"] = [int(dim) for dim in value]
        elif key == "optional":
            tensor["optional"] = bool(value)
        elif key == "label_filename":
            tensor["label_filename"] = value
        elif key == "reshape":
            tensor["reshape"] = [int(dim) for dim in value.get("shape", [])]
        elif key == "format" and value in ("FORMAT_NONE", "FORMAT_NCHW", "FORMAT_NHWC"):
            continue  # describes the layout for tools; it changes nothing in the computation
        elif key in ("is_shape_tensor", "allow_ragged_batch") and not value:
            continue
        else:
            raise ConfigError(f"{where}.{key}: not supported by reposerve")
    tensor.setdefault("shape", [])
    return tensor


def _datatype(value: str, where: str) -> str:
    if value == "TYPE_STRING":
        return "BYTES"
    if not value.startswith("TYPE_") or value == "TYPE_INVALID":
        raise ConfigError(f"{where}: '{value}' is not a datatype")
    return value.removeprefix("TYPE_")


def _positional_order(tensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Triton's libtorch backend binds ``NAME__i`` to position i whatever the order in
    the file; reposerve's torch backend binds by config order, so order them by i."""
    matches = [_POSITIONAL.match(tensor.get("name", "")) for tensor in tensors]
    if not all(matches):
        return tensors
    positions = [int(match[1]) for match in matches if match is not None]
    return [tensors[i] for i in sorted(range(len(tensors)), key=positions.__getitem__)]


def _version_policy(table: dict[str, Any], value: dict[str, Any], where: str) -> None:
    if "latest" in value:
        table["version_policy"] = {"latest": int(value["latest"].get("num_versions", 1))}
    elif "all" in value:
        table["version_policy"] = {"all": True}
    elif "specific" in value:
        versions = [int(version) for version in value["specific"].get("versions", [])]
        table["version_policy"] = {"specific": versions}


def _instance_groups(table: dict[str, Any], value: list[dict[str, Any]], where: str) -> None:
    groups = []
    for index, item in enumerate(value):
        # Triton's default kind is KIND_AUTO (protobuf's JSON leaves it out when it is that).
        group: dict[str, Any] = {"kind": "auto"}
        for key, field in item.items():
            here = f"{where}[{index}].{key}"
            if key == "kind":
                if field not in _KINDS:
                    raise ConfigError(f"{here}: {field} is not supported by reposerve")
                group["kind"] = _KINDS[field]
            elif key == "count":
                group["count"] = int(field)
            elif key == "gpus":
                group["gpus"] = [int(gpu) for gpu in field]
            elif key != "name":  # a group's name only labels it
                raise ConfigError(f"{here}: not supported by reposerve")
        groups.append(group)
    table["instance_group"] = groups


def _dynamic_batching(table: dict[str, Any], value: dict[str, Any], where: str) -> None:
    batching: dict[str, Any] = {}
    for key, field in value.items():
        if key == "preferred_batch_size":
            batching[key] = [int(size) for size in field]
        elif key in ("max_queue_delay_microseconds", "priority_levels", "default_priority_level"):
            batching[key] = int(field)
        elif key == "preserve_ordering":
            batching[key] = bool(field)
        elif key == "default_queue_policy":
            batching.update(_queue_policy(field, f"{where}.{key}"))
        else:
            raise ConfigError(f"{where}.{key}: not supported by reposerve")
    table["dynamic_batching"] = batching


def _queue_policy(value: dict[str, Any], where: str) -> dict[str, Any]:
    policy: dict[str, Any] = {}
    for key, field in value.items():
        if key == "timeout_action" and field != "REJECT":
            raise ConfigError(f"{where}.timeout_action: {field} is not supported (REJECT is)")
        if key in ("max_queue_size", "default_timeout_microseconds"):
            policy[key] = int(field)
        elif key not in ("timeout_action", "allow_timeout_override"):
            raise ConfigError(f"{where}.{key}: not supported by reposerve")
    return policy


def _warmups(table: dict[str, Any], value: list[dict[str, Any]], where: str) -> None:
    warmups = []
    for index, item in enumerate(value):
        here = f"{where}[{index}]"
        inputs = {}
        for name, sample in item.get("inputs", {}).items():
            _check_warmup_shape(table, sample, f"{here}.inputs.{name}", name)
            if sample.get("zero_data"):
                inputs[name] = "zero"
            elif sample.get("random_data"):
                inputs[name] = "random"
            else:
                raise ConfigError(
                    f"{here}.inputs.{name}: only zero_data and random_data are supported"
                )
        unknown = sorted(set(item) - {"name", "batch_size", "inputs", "count"})
        if unknown:
            raise ConfigError(f"{here}.{unknown[0]}: not supported by reposerve")
        entry = {"batch_size": max(int(item.get("batch_size", 1)), 1), "inputs": inputs}
        warmups += [entry] * max(int(item.get("count", 1)), 1)
    table["warmup"] = warmups


def _check_warmup_shape(
    table: dict[str, Any], sample: dict[str, Any], where: str, name: str
) -> None:
    """reposerve warms each input up in its declared datatype and shape (-1 as 1): a Triton
    warmup asking for another is refused rather than run differently."""
    spec = next((t for t in table.get("input", []) if t.get("name") == name), None)
    if spec is None:
        raise ConfigError(f"{where}: the model has no input '{name}'")
    datatype = sample.get("data_type")
    if datatype is not None and _datatype(datatype, f"{where}.data_type") != spec["datatype"]:
        raise ConfigError(f"{where}.data_type: {datatype}, but the input is {spec['datatype']}")
    expected = [1 if dim < 0 else dim for dim in spec["shape"]]
    dims = [int(dim) for dim in sample.get("dims", [])]
    if dims != expected:
        raise ConfigError(
            f"{where}.dims: {dims}: reposerve warms inputs up at their shape with -1 as 1 "
            f"({expected})"
        )


def _optimization(table: dict[str, Any], value: dict[str, Any], where: str) -> None:
    for key, field in value.items():
        if key != "execution_accelerators":
            raise ConfigError(f"{where}.{key}: not supported by reposerve")
        for side, accelerators in field.items():
            for index, accelerator in enumerate(accelerators):
                here = f"{where}.execution_accelerators.{side}[{index}]"
                if side != "gpu_execution_accelerator" or accelerator.get("name") != "tensorrt":
                    raise ConfigError(f"{here}: only the GPU accelerator tensorrt is supported")
                _tensorrt(table, accelerator.get("parameters", {}), here)


def _tensorrt(table: dict[str, Any], parameters: dict[str, str], where: str) -> None:
    """Triton's TensorRT accelerator for onnxruntime, as reposerve's provider options."""
    options: dict[str, Any] = {}
    for key, field in parameters.items():
        if key == "precision_mode":
            if field not in ("FP32", "FP16"):
                raise ConfigError(f"{where}.parameters.precision_mode: {field} is not supported")
            options["trt_fp16_enable"] = field == "FP16"
        elif key == "max_workspace_size_bytes":
            options["trt_max_workspace_size"] = int(field)
        elif key == "trt_engine_cache_enable":
            options["trt_engine_cache_enable"] = field == "true"
        else:
            raise ConfigError(f"{where}.parameters.{key}: not supported by reposerve")
    onnxruntime = table.setdefault("parameters", {}).setdefault("onnxruntime", {})
    onnxruntime["tensorrt"] = options


def _default_model_filename(table: dict[str, Any], value: str, where: str) -> None:
    if value:
        table["default_model_filename"] = value


def _ensemble_scheduling(table: dict[str, Any], value: dict[str, Any], where: str) -> None:
    steps = []
    for index, step in enumerate(value.get("step", [])):
        if step.get("model_namespace"):
            raise ConfigError(f"{where}.step[{index}].model_namespace: not supported by reposerve")
        steps.append(
            {
                "model": step.get("model_name", ""),
                "version": int(step.get("model_version", -1)),
                "input_map": dict(step.get("input_map", {})),
                "output_map": dict(step.get("output_map", {})),
            }
        )
    table["step"] = steps


def _sequence_batching(table: dict[str, Any], value: dict[str, Any], where: str) -> None:
    table["sequence_batching"] = sequence_from_triton(value, where)


def _transaction_policy(table: dict[str, Any], value: dict[str, Any], where: str) -> None:
    if value.get("decoupled"):
        table["decoupled"] = True


_FIELDS = {
    "name": _name,
    "platform": _backend,
    "backend": _backend,
    "max_batch_size": _max_batch_size,
    "input": _tensors("input"),
    "output": _tensors("output"),
    "version_policy": _version_policy,
    "instance_group": _instance_groups,
    "dynamic_batching": _dynamic_batching,
    "model_warmup": _warmups,
    "optimization": _optimization,
    "default_model_filename": _default_model_filename,
    "model_transaction_policy": _transaction_policy,
    "ensemble_scheduling": _ensemble_scheduling,
    "sequence_batching": _sequence_batching,
}


# Out: a ModelConfig as Triton's model-config JSON.

_TRITON_KINDS = {kind: name for name, kind in _KINDS.items()}


def to_triton(name: str, backend: str, config: ModelConfig) -> dict[str, Any]:
    """``config`` in Triton's model-config JSON (what ``GET .../config`` returns): every
    field one of Triton's ``ModelConfig``, so its tools parse it strictly."""
    entry = backend_entry(backend)
    document: dict[str, Any] = {
        "name": name,
        "platform": entry.triton_platform,
        "backend": entry.triton_backend,
        "version_policy": _policy_out(config),
        "max_batch_size": config.max_batch_size,
        "default_model_filename": config.default_model_filename or "",
        "input": [
            {
                "name": spec.name,
                "data_type": TRITON_CONFIG_TYPES[spec.datatype],
                "format": "FORMAT_NONE",
                "dims": spec.shape,
                **_reshape_out(spec),
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": spec.optional,
            }
            for spec in config.input
        ],
        "output": [
            {
                "name": spec.name,
                "data_type": TRITON_CONFIG_TYPES[spec.datatype],
                "dims": spec.shape,
                **_reshape_out(spec),
                "label_filename": spec.label_filename or "",
                "is_shape_tensor": False,
            }
            for spec in config.output
        ],
        "batch_input": [],
        "batch_output": [],
        "instance_group": [
            {
                "name": f"{name}_{index}",
                "kind": _TRITON_KINDS[group.kind],
                "count": group.count,
                "gpus": group.gpus or [],
                "secondary_devices": [],
                "profile": [],
                "passive": False,
                "host_policy": "",
            }
            for index, group in enumerate(config.instance_group or ())  # resolved once loaded
        ],
        # reposerve-only settings (precision, execution limits, pinned cores) travel in
        # Triton's free-form parameters: a strict protobuf parse rejects any other field.
        "parameters": to_triton_parameters(config),
        "model_warmup": [
            {
                "name": f"warmup_{index}",
                "batch_size": warmup.batch_size,
                "inputs": {
                    spec.name: {
                        "data_type": TRITON_CONFIG_TYPES[spec.datatype],
                        "dims": [max(dim, 1) for dim in spec.shape],
                        "zero_data"
                        if warmup.inputs.get(spec.name, "zero") == "zero"
                        else "random_data": True,
                    }
                    for spec in config.input
                },
            }
            for index, warmup in enumerate(config.warmup)
        ],
        "model_transaction_policy": {"decoupled": config.decoupled},
    }
    if config.step:
        document["ensemble_scheduling"] = {
            "step": [
                {
                    "model_name": step.model,
                    "model_version": step.version,
                    "input_map": step.input_map,
                    "output_map": step.output_map,
                    "model_namespace": "",
                }
                for step in config.step
            ]
        }
    if config.sequence_batching is not None:
        document["sequence_batching"] = sequence_to_triton(config.sequence_batching)
    batching = config.dynamic_batching
    if batching is not None:
        document["dynamic_batching"] = {
            "preferred_batch_size": batching.preferred_batch_size,
            "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
            "preserve_ordering": batching.preserve_ordering,
            "priority_levels": batching.priority_levels,
            "default_priority_level": batching.default_priority_level,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": batching.default_timeout_microseconds,
                "allow_timeout_override": True,
                "max_queue_size": batching.max_queue_size,
            },
        }
    return document


def _reshape_out(spec: TensorConfig) -> dict[str, Any]:
    """Triton's ``reshape`` field, there only when the model sees another shape."""
    return {} if spec.reshape is None else {"reshape": {"shape": spec.reshape}}


def _policy_out(config: ModelConfig) -> dict[str, Any]:
    policy = config.version_policy
    if policy.all:
        return {"all": {}}
    if policy.specific is not None:
        return {"specific": {"versions": policy.specific}}
    return {"latest": {"num_versions": policy.latest or 1}}
