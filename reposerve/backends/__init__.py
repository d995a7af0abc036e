"""Backends: load a model version, execute one batch of numpy arrays, unload.

They know nothing of queues, processes or HTTP; only the instance worker runs them.
"""

from __future__ import annotations

from reposerve.backends.base import Backend, BackendError, ModelContext, Signature


def create_backend(name: str, context: ModelContext) -> Backend:
    """Load ``context``'s model with the named backend; with Triton's ``reshape`` on any of
    its tensors, the model sees those shapes and clients the declared ones."""
    backend = _load(name, context)
    from reposerve.backends.reshape import ReshapedBackend, needs_reshape

    if needs_reshape(context.config):
        return ReshapedBackend(backend, context.config)  # type: ignore[return-value]
    return backend


def _load(name: str, context: ModelContext) -> Backend:
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
