"""Backends: load a model version, execute one batch of numpy arrays, unload.

They know nothing of queues, processes or HTTP; only the instance worker runs them.
"""

from __future__ import annotations

from reposerve.backends.base import Backend, BackendError, ModelContext, Signature


def create_backend(name: str, context: ModelContext) -> Backend:
    """Load ``context``'s model with the named backend."""
    # Imported on demand: an instance process loads only its own backend's libraries.
    if name == "python":
        from reposerve.backends.python import create_python_backend

        return create_python_backend(context)
    if name == "onnxruntime":
        from reposerve.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(context)
    if name == "torch":
        from reposerve.backends.torch import TorchBackend

        return TorchBackend(context)
    raise BackendError(f"backend '{name}' is not available in this build of reposerve")


__all__ = ["Backend", "BackendError", "ModelContext", "Signature", "create_backend"]
