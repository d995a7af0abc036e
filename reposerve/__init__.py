"""reposerve: a config-driven model repository server speaking KServe V2 over HTTP."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reposerve.errors import InvalidInput, ModelCallError, ReposerveError

if TYPE_CHECKING:
    from reposerve.embedded import InferResult, Server

__all__ = ["InferResult", "InvalidInput", "ModelCallError", "ReposerveError", "Server"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Deferred: a model's ``import reposerve`` (for InvalidInput) must not load the server.
    if name in ("Server", "InferResult"):
        from reposerve import embedded

        return getattr(embedded, name)
    raise AttributeError(f"module 'reposerve' has no attribute {name!r}")
