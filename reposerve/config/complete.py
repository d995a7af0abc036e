"""Complete a config from what the model file says (Triton's auto-complete).

``[[input]]`` and ``[[output]]`` may be omitted for models whose backend reads them from
the model file (``auto_complete`` in ``backends``: onnxruntime and torch): they are filled
in here. When they are given, they must agree with the file; a mismatch names both.
"""

from __future__ import annotations

import msgspec

from reposerve.config.backends import backend_entry
from reposerve.config.schema import DynamicBatching, ModelConfig, TensorConfig
from reposerve.config.sequences import implied_tensors
from reposerve.errors import ConfigError


def complete_config(
    config: ModelConfig,
    inputs: list[TensorConfig],
    outputs: list[TensorConfig],
    label: str,
) -> ModelConfig:
    """``inputs``/``outputs``: the model's own tensors, full shapes, -1 where dynamic."""
    config = _max_batch_size(config, inputs + outputs)
    implied_inputs, implied_outputs = implied_tensors(config)
    batch = config.max_batch_size
    return msgspec.structs.replace(
        config,
        input=_section("input", config.input, inputs, batch, label, implied_inputs),
        output=_section("output", config.output, outputs, batch, label, implied_outputs),
    )


def _max_batch_size(config: ModelConfig, tensors: list[TensorConfig]) -> ModelConfig:
    """Triton's onnxruntime auto-complete: a model that does not say it batches does,
    up to ``default_max_batch_size``, when every tensor's first dimension is dynamic
    (dynamic batching on, when more than 1 and none configured)."""
    default = config.default_max_batch_size
    if not default:
        return config
    batchable = all(tensor.shape and tensor.shape[0] == -1 for tensor in tensors)
    if config.max_batch_size or config.input or config.output or not batchable:
        return msgspec.structs.replace(config, default_max_batch_size=0)
    batching = config.dynamic_batching
    if batching is None and default > 1:
        batching = DynamicBatching()
    return msgspec.structs.replace(
        config, max_batch_size=default, dynamic_batching=batching, default_max_batch_size=0
    )


def _section(
    section: str,
    declared: list[TensorConfig],
    found: list[TensorConfig],
    max_batch: int,
    label: str,
    implied: set[str],
) -> list[TensorConfig]:
    """``implied``: tensors the server adds (sequence batching's), declared whether or not
    the config gave the client's: those left out are filled in from the file beside them."""
    items = {tensor.name: _item(tensor, section, max_batch, label) for tensor in found}
    if all(tensor.name in implied for tensor in declared):
        filled = [tensor for name, tensor in items.items() if name not in implied]
        declared = filled + declared
        if not declared:
            return list(items.values())
    for tensor in declared:
        model = items.get(tensor.name)
        if model is None:
            names = ", ".join(items) or "none"
            raise ConfigError(
                f"{label}: {section} '{tensor.name}' is not in the model file (it has: {names})"
            )
        if tensor.datatype != model.datatype:
            raise ConfigError(
                f"{label}: {section} '{tensor.name}': declared {tensor.datatype}, "
                f"the model file says {model.datatype}"
            )
        # With a reshape, that is the shape the model has; clients see the declared one.
        seen = tensor.shape if tensor.reshape is None else tensor.reshape
        if not _compatible(seen, model.shape):
            what = "shape" if tensor.reshape is None else "reshape"
            raise ConfigError(
                f"{label}: {section} '{tensor.name}': declared {what} {seen}, "
                f"the model file says {model.shape} (per item, batch dimension excluded)"
            )
    return declared


def _item(tensor: TensorConfig, section: str, max_batch: int, label: str) -> TensorConfig:
    """The per-item view of a model tensor: without its batch dimension when batching."""
    if max_batch == 0:
        return tensor
    if not tensor.shape or tensor.shape[0] != -1:
        raise ConfigError(
            f"{label}: max_batch_size {max_batch} needs a dynamic first dimension, but the "
            f"model's {section} '{tensor.name}' has shape {tensor.shape}; set max_batch_size = 0"
        )
    return msgspec.structs.replace(tensor, shape=tensor.shape[1:])


def _compatible(declared: list[int], model: list[int]) -> bool:
    return len(declared) == len(model) and all(
        a == b or -1 in (a, b) for a, b in zip(declared, model, strict=True)
    )


def require_declared(config: ModelConfig, backends: set[str], label: str) -> None:
    """With auto-complete off (Triton's --disable-auto-complete-config) nothing is read
    from the model file into the config: it must declare the inputs and outputs itself."""
    missing = [section for section in ("input", "output") if not getattr(config, section)]
    if missing and any(backend_entry(backend).auto_complete for backend in backends):
        sections = " and ".join(f"[[{section}]]" for section in missing)
        raise ConfigError(
            f"{label}: the config declares no {sections}, and auto-complete is off "
            "(--disable-auto-complete-config / --strict-model-config true). Hint: declare "
            "them, or let reposerve read them from the model file"
        )
