"""What every backend offers the instance worker, and what it is told at load."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Protocol

import msgspec
import numpy as np

from reposerve.config import ModelConfig, TensorConfig
from reposerve.errors import ReposerveError


class BackendError(ReposerveError):
    """A model that cannot be loaded or returned something unusable."""


class ModelContext(msgspec.Struct, frozen=True):
    """Handed to a model's ``load``: which version and instance it is, and where it runs."""

    model_name: str
    config: ModelConfig
    version: int
    version_path: Path
    device: str  # "cpu" or "cuda:N" as the instance process sees it
    instance_index: int
    threads: int  # the instance's share of the CPU cores (intra-op threads)


Arrays = dict[str, np.ndarray]
Signature = tuple[list[TensorConfig], list[TensorConfig]]
"""A model file's (inputs, outputs), full shapes with -1 where dynamic."""


class Backend(Protocol):
    is_async: bool

    def signature(self) -> Signature | None:
        """What the model file says its tensors are, when it says (auto-complete)."""
        ...

    def execute(self, inputs: Arrays) -> Arrays | Awaitable[Arrays]: ...

    def unload(self) -> None: ...
