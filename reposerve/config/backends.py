"""What each backend is, one entry per backend: every part of reposerve that depends on which
backend a model runs reads it here, and nothing else keys on a backend's name.

A new backend is its module in ``reposerve/backends/`` (a class or function taking the
``ModelContext``) and one entry below; when it needs packages, an extra in pyproject.toml
named by ``extra``; when it has options in ``[parameters]``, a Struct of them in
``config/`` that ``options`` converts to.

Who reads which field:

- ``config.schema``: the names ``backend`` may take in config.toml (``name``)
- ``config.parameters``: ``precisions``, ``options``, ``file_rule`` (checked with the rest
  of the config, so ``reposerve check`` and a load refuse the same configs)
- ``config.complete``: ``auto_complete``
- ``config.triton``: Triton's names both ways (``triton_platform``, ``triton_backend``),
  ``triton_parameters``, ``triton_only``, ``positional_names``
- ``repository.scan``: ``files`` (which backend a version folder holds), ``configless``
- ``config.ensemble``, ``repository.version``, ``repository.manager``: ``pipeline`` (an
  ensemble: steps, no instance process)
- ``protocol.documents``: the platform in model metadata
- ``reposerve.backends``: ``loader`` and ``extra``, in the instance process

The order of ``BACKENDS`` is the order messages list them in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from reposerve.config.onnx_options import onnx_parameters
from reposerve.config.torch_options import torch_file_rule, torch_options

if TYPE_CHECKING:  # only in annotations: schema imports NAMES from here
    from reposerve.config.schema import ModelConfig


class TritonParameter(msgspec.Struct, frozen=True):
    """One of Triton's own parameters of a backend, as reposerve's equivalent: the key
    ``key`` in the ``[parameters]`` table at ``path``, its value an int, or with
    ``choices`` the name Triton's number stands for."""

    path: tuple[str, ...]
    key: str
    choices: tuple[str, ...] = ()

    def convert(self, text: Any) -> Any:
        """Triton's value as ours; ValueError, IndexError or TypeError when it is none."""
        number = int(text)
        if not self.choices:
            return number
        if number < 0:
            raise IndexError(f"{number} is not one of 0..{len(self.choices) - 1}")
        return self.choices[number]


class BackendEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One backend, as every layer outside its own module sees it."""

    name: str  # config.toml's ``backend = "..."``
    files: tuple[str, ...] = ()  # the model file names a version folder may hold
    # Added to the error when a version lacks them, with {path}: Triton's words, which its
    # tests look for in the log.
    missing_file: str = ""
    # ``module:attribute``, called with the ModelContext in the instance process; "" for a
    # pipeline, which runs none.
    loader: str = ""
    extra: str | None = None  # the pyproject extra that installs its packages
    pipeline: bool = False  # its steps are the model: no model file, no instance process
    triton_platform: str = ""  # Triton's platform name ("" where Triton names only a backend)
    triton_backend: str = ""  # Triton's backend name ("" where Triton names only a platform)
    # The model file carries its tensors' names, types and shapes (Triton's auto-complete).
    auto_complete: bool = False
    # A folder holding this backend's model file needs no config file (one is generated):
    # what such a model is, for the error that says which may go without ("" for none).
    configless: str = ""
    # A generated config batches up to this when every tensor's first dimension is dynamic.
    default_max_batch_size: int = 0
    precisions: tuple[str, ...] = ("fp32", "fp16", "bf16")  # [optimization] precision
    # Checks the backend's keys of [parameters] (ConfigError naming file and key) and
    # returns them typed; the backend calls it again for the values.
    options: Callable[[dict[str, Any], str], object] | None = None
    # What the config may not ask of a version given the names of its model files (those
    # of ``files`` it holds, or its default_model_filename): ``key: reason``, or None.
    file_rule: Callable[[ModelConfig, tuple[str, ...]], str | None] | None = None
    # Triton's parameters for its counterpart of this backend that reposerve reads, and
    # those it reads and reposerve refuses (no equivalent).
    triton_parameters: dict[str, TritonParameter] = {}
    triton_only: frozenset[str] = frozenset()
    positional_names: bool = False  # Triton binds tensors named NAME__i by position i

    @property
    def triton_names(self) -> tuple[str, ...]:
        """The names config.pbtxt's ``platform`` or ``backend`` may give it."""
        return tuple(name for name in (self.triton_backend, self.triton_platform) if name)


_ORT_CUDA = ("onnxruntime", "cuda")

BACKENDS: tuple[BackendEntry, ...] = (
    BackendEntry(
        name="python",
        files=("model.py",),
        missing_file=(
            " (Failed to preinitialize Python stub: Python model file not found in '{path}')"
        ),
        loader="reposerve.backends.python:create_python_backend",
        triton_backend="python",
        configless="a python model whose auto_complete_config fills it in (N/model.py)",
    ),
    BackendEntry(
        name="onnxruntime",
        files=("model.onnx",),
        loader="reposerve.backends.onnxruntime:OnnxRuntimeBackend",
        extra="onnx",
        triton_platform="onnxruntime_onnx",
        triton_backend="onnxruntime",
        auto_complete=True,
        configless="an ONNX model (N/model.onnx)",
        # Triton's onnxruntime backend batches auto-completed models up to this by default
        # (--backend-config=onnxruntime,default-max-batch-size=4).
        default_max_batch_size=4,
        precisions=("fp32", "fp16"),
        options=onnx_parameters,
        triton_parameters={
            "intra_op_thread_count": TritonParameter((), "intra_op_threads"),
            "cudnn_conv_algo_search": TritonParameter(
                _ORT_CUDA, "cudnn_conv_algo_search", ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")
            ),
            "gpu_mem_limit": TritonParameter(_ORT_CUDA, "gpu_mem_limit"),
            "arena_extend_strategy": TritonParameter(
                _ORT_CUDA, "arena_extend_strategy", ("kNextPowerOfTwo", "kSameAsRequested")
            ),
        },
        triton_only=frozenset(
            {
                "inter_op_thread_count",
                "execution_mode",
                "enable_mem_arena",
                "enable_mem_pattern",
                "memory.enable_memory_arena_shrinkage",
                "share_session_between_instances",
                "enable_cpu_mem_arena",
                "session.use_device_allocator_for_initializers",
            }
        ),  # fmt: skip
    ),
    BackendEntry(
        name="torch",
        files=("model.pt", "model.pt2"),
        loader="reposerve.backends.torch:TorchBackend",
        extra="torch",
        triton_platform="pytorch_libtorch",
        triton_backend="pytorch",
        auto_complete=True,
        options=torch_options,
        file_rule=torch_file_rule,
        triton_only=frozenset(
            {
                "DISABLE_OPTIMIZED_EXECUTION",
                "INFERENCE_MODE",
                "ENABLE_NVFUSER",
                "ENABLE_JIT_EXECUTOR",
                "ENABLE_JIT_PROFILING",
                "ENABLE_TENSOR_FUSER",
                "ENABLE_WEIGHT_SHARING",
                "ENABLE_CACHE_CLEANING",
                "NUM_THREADS",
            }
        ),  # fmt: skip
        positional_names=True,
    ),
    BackendEntry(name="ensemble", pipeline=True, triton_platform="ensemble"),
)

BY_NAME = {entry.name: entry for entry in BACKENDS}
NAMES = tuple(BY_NAME)


def backend_entry(name: str) -> BackendEntry:
    """The entry of a backend the schema accepted (KeyError for any other name)."""
    return BY_NAME[name]
