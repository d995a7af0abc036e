"""The model repository: scanning the folder, each version's lifecycle, load/swap/unload."""

from reposerve.repository.manager import Repository
from reposerve.repository.version import ModelState, ModelVersion

__all__ = ["ModelState", "ModelVersion", "Repository"]
