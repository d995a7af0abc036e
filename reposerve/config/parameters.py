"""Every rule on ``[parameters]`` and on what a backend supports that the config alone can
decide, applied when a config is read: ``reposerve check`` and a load refuse the same
configs with the same ``file: key: reason`` message, before any instance process starts.

1. The server's own keys (``ServerParameters``), whatever the backend.
2. The backend's, from its entry in ``backends``: the ``precision`` it can run, its
   options (``onnx_options.OnnxParameters``, ``torch_options.TorchOptions``), and what the
   config may not ask of its model files (a TorchScript file). When the config names no
   backend, ``repository.scan`` applies these once the model files tell it.

The instance side reads the same typed values from these functions and checks nothing
again. Left to the instance, because they need the model file's contents or the runtime:
whether a GPU provider or TensorRT exists in the onnxruntime build, whether torch can
autocast to ``precision`` on the device, torch.compile's ``mode``/``backend`` names, and
``decoupled`` without a generator ``execute``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from reposerve.config.backends import backend_entry
from reposerve.config.schema import ModelConfig
from reposerve.config.tables import convert_table
from reposerve.errors import ConfigError

# How many batches one async instance may hold at once unless [parameters] says otherwise.
DEFAULT_ASYNC_INFLIGHT = 256


class ServerParameters(msgspec.Struct, frozen=True, kw_only=True):
    """The keys of ``[parameters]`` reposerve itself reads (the rest are the backend's)."""

    # Every instance's intra-op thread count (None: placement decides).
    intra_op_threads: Annotated[int, Meta(ge=1)] | None = None
    # Batches one async instance may hold at once.
    max_inflight_batches: Annotated[int, Meta(ge=1)] = DEFAULT_ASYNC_INFLIGHT
    # A sync instance accepts one batch beyond the one it runs, staged in shared memory.
    stage_next_batch: bool = True


def server_parameters(parameters: dict[str, Any], label: str) -> ServerParameters:
    raw = {key: parameters[key] for key in ServerParameters.__struct_fields__ if key in parameters}
    return convert_table(raw, ServerParameters, label, "parameters")


def check_parameters(config: ModelConfig, label: str) -> None:
    """The rules of a config as read: the server's keys, and the backend's rules when the
    config names its backend. ConfigError names ``label``, the key and the reason."""
    server_parameters(config.parameters, label)
    if config.backend is not None:
        check_backend(config, config.backend, label)


def check_backend(config: ModelConfig, backend: str, label: str) -> None:
    """The rules ``backend`` sets on ``config``: the precisions it runs, its options."""
    entry = backend_entry(backend)
    precision = config.optimization.precision
    if precision not in entry.precisions:
        raise ConfigError(
            f"{label}: optimization.precision: {precision} is not supported by the {backend} "
            f"backend. Hint: use {' or '.join(reversed(entry.precisions))}"
        )
    if entry.options is not None:
        entry.options(config.parameters, label)


def check_files(config: ModelConfig, backend: str, files: tuple[str, ...], label: str) -> None:
    """The rules ``backend`` sets on ``config`` given a version's model files (their names)."""
    rule = backend_entry(backend).file_rule
    problem = rule(config, files) if rule is not None else None
    if problem:
        raise ConfigError(f"{label}: {problem}")
