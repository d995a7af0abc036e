"""Backends: load a model version, execute one batch of numpy arrays, unload.

They know nothing of queues, processes or HTTP; only the instance worker runs them. Which
module loads a backend, and which extra installs its packages, is its entry in
``reposerve.config.backends``.
"""

from __future__ import annotations

import importlib

from reposerve.backends.base import Backend, BackendError, ModelContext, Signature
from reposerve.config.backends import BY_NAME


def create_backend(name: str, context: ModelContext) -> Backend:
    """Load ``context``'s model with the named backend; with Triton's ``reshape`` on any of
    its tensors, the model sees those shapes and clients the declared ones."""
    backend = _load(name, context)
    from reposerve.backends.reshape import ReshapedBackend, needs_reshape

    if needs_reshape(context.config):
        return ReshapedBackend(backend, context.config)
    return backend


def _load(name: str, context: ModelContext) -> Backend:
    entry = BY_NAME.get(name)
    if entry is None or not entry.loader:
        raise BackendError(f"backend '{name}' is not available in this build of reposerve")
    module_name, _, attribute = entry.loader.partition(":")
    # Imported on demand: an instance process loads only its own backend's libraries.
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if entry.extra is None:
            raise
        raise BackendError(
            f"the {name} backend needs the {entry.extra} extra: "
            f"pip install 'reposerve[{entry.extra}]'"
        ) from exc
    return getattr(module, attribute)(context)


__all__ = ["Backend", "BackendError", "ModelContext", "Signature", "create_backend"]
