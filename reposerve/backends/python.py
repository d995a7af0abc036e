"""The python backend: ``N/model.py`` defining ``class Model``.

The contract a model file follows:

1. ``Model()`` is constructed with no arguments.
2. ``load(context)`` (optional) runs once, before any request; ``context`` is a
   ``ModelContext`` (config, version, version_path, device, instance_index, threads).
3. ``execute(inputs)`` gets ``{input name: numpy array}`` (batch on axis 0 when
   ``max_batch_size > 0``; BYTES as object arrays of bytes) and returns
   ``{output name: array}``. It may be ``async def``; then one instance runs many at once.
   Input arrays are views on shared memory, valid only until ``execute`` returns.
   Written as a generator (``yield`` each response; sync or async), the model is
   decoupled: each yielded dict is one response to every request of the batch, the
   last one ends them, and a cancel arrives as GeneratorExit / CancelledError at the
   ``yield`` (or ``await``) the model is stopped at.
4. ``unload()`` (optional) runs once when the instance stops.

A file written for Triton's python backend (``class TritonPythonModel`` and no ``Model``)
runs through the shim in ``triton_python``; ``import triton_python_backend_utils`` gives
it ``pb_utils``.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from collections.abc import Awaitable
from types import ModuleType

from reposerve.backends import pb_utils
from reposerve.backends.base import (
    Arrays,
    Backend,
    BackendError,
    ModelContext,
    Outputs,
    Responses,
    Signature,
)

MODEL_FILE = "model.py"
TRITON_UTILS = "triton_python_backend_utils"  # the module name Triton's models import


def create_python_backend(context: ModelContext) -> Backend:
    """Load ``model.py``: our ``class Model``, else Triton's ``class TritonPythonModel``."""
    path = context.model_file(MODEL_FILE)
    module = _load_module(context)
    model_class = getattr(module, "Model", None)
    if inspect.isclass(model_class):
        return PythonBackend(model_class, context, str(path))
    triton_class = getattr(module, "TritonPythonModel", None)
    if inspect.isclass(triton_class):
        from reposerve.backends.triton_python import TritonPythonBackend

        return TritonPythonBackend(triton_class, context, str(path))
    raise BackendError(
        f"{path}: defines no class Model. Hint: add `class Model:` with an "
        "`execute(self, inputs)` method (or Triton's `class TritonPythonModel`)"
    )


def _load_module(context: ModelContext) -> ModuleType:
    """The model file, run as the module ``model`` of a package that is its version
    folder (so ``from . import helper`` works, as in Triton), that folder importable too."""
    path = context.model_file(MODEL_FILE)
    if not path.is_file():  # Triton's words, which its tests look for in the log
        raise BackendError(
            f"Failed to preinitialize Python stub: Python model file not found in '{path}'"
        )
    package_name = re.sub(r"\W", "_", f"reposerve_model_{context.model_name}_{context.version}")
    package = ModuleType(package_name)
    package.__path__ = [str(context.version_path)]
    sys.modules[package_name] = package
    module_name = f"{package_name}.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BackendError(f"{path}: not a python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    # Before the file runs: Triton's models import this at the top. Ours wins over a copy
    # of Triton's file in the model folder (older Triton docs said to put one there).
    sys.modules.setdefault(TRITON_UTILS, pb_utils)
    # The model's folder is importable, as Triton's python backend allows helper modules.
    sys.path.insert(0, str(context.version_path))
    spec.loader.exec_module(module)
    return module


class PythonBackend:
    def __init__(self, model_class: type, context: ModelContext, where: str) -> None:
        self._model = model_class()
        execute = getattr(self._model, "execute", None)
        if not callable(execute):
            raise BackendError(f"{where}: class Model has no execute(self, inputs) method")
        self._execute = execute
        self.decoupled = inspect.isgeneratorfunction(execute) or inspect.isasyncgenfunction(execute)
        self.is_async = inspect.iscoroutinefunction(execute) or inspect.isasyncgenfunction(execute)
        load = getattr(self._model, "load", None)
        if callable(load):
            load(context)

    def signature(self) -> Signature | None:
        return None  # python models declare their tensors in config.toml

    def execute(self, inputs: Arrays) -> Outputs | Awaitable[Outputs] | Responses:
        return self._execute(inputs)

    def unload(self) -> None:
        unload = getattr(self._model, "unload", None)
        if callable(unload):
            unload()
