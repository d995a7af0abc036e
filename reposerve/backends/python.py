"""The python backend: ``N/model.py`` defining ``class Model``.

The contract a model file follows:

1. ``Model()`` is constructed with no arguments.
2. ``load(context)`` (optional) runs once, before any request; ``context`` is a
   ``ModelContext`` (config, version, version_path, device, instance_index, threads).
3. ``execute(inputs)`` gets ``{input name: numpy array}`` (batch on axis 0 when
   ``max_batch_size > 0``; BYTES as object arrays of bytes) and returns
   ``{output name: array}``. It may be ``async def``; then one instance runs many at once.
   Input arrays are views on shared memory, valid only until ``execute`` returns.
4. ``unload()`` (optional) runs once when the instance stops.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Awaitable

from reposerve.backends.base import Arrays, BackendError, ModelContext, Signature

MODEL_FILE = "model.py"


class PythonBackend:
    def __init__(self, context: ModelContext) -> None:
        path = context.version_path / MODEL_FILE
        module_name = f"reposerve_model_{context.model_name}_{context.version}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise BackendError(f"{path}: not a python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        # The model's folder is importable, as Triton's python backend allows helper modules.
        sys.path.insert(0, str(context.version_path))
        spec.loader.exec_module(module)
        model_class = getattr(module, "Model", None)
        if not inspect.isclass(model_class):
            raise BackendError(
                f"{path}: defines no class Model. Hint: add `class Model:` with an "
                "`execute(self, inputs)` method"
            )
        self._model = model_class()
        execute = getattr(self._model, "execute", None)
        if not callable(execute):
            raise BackendError(f"{path}: class Model has no execute(self, inputs) method")
        self._execute = execute
        self.is_async = inspect.iscoroutinefunction(execute)
        load = getattr(self._model, "load", None)
        if callable(load):
            load(context)

    def signature(self) -> Signature | None:
        return None  # python models declare their tensors in config.toml

    def execute(self, inputs: Arrays) -> Arrays | Awaitable[Arrays]:
        return self._execute(inputs)

    def unload(self) -> None:
        unload = getattr(self._model, "unload", None)
        if callable(unload):
            unload()
