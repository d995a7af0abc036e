"""reposerve on Ray Serve: ``serve run reposerve.ray:app model_repository=PATH``.

Each replica holds a reposerve server (instances, schedulers, batching) on the repository,
serves V2 HTTP through Ray's proxy and ``infer`` to ``DeploymentHandle`` callers; Ray
places the replicas and scales them on ongoing requests. Needs ``reposerve[ray]``.
"""

from __future__ import annotations

try:
    import ray.serve  # noqa: F401 - only to say what is missing, and how to get it
except ImportError as exc:
    raise ImportError(
        f"reposerve.ray needs Ray Serve ({exc}); Hint: pip install 'reposerve[ray]'"
    ) from exc

from reposerve.ray.application import app
from reposerve.ray.replica import Reposerve

__all__ = ["Reposerve", "app"]
