"""Files a config names inside its model folder (label files, initial state files): the
one rule that keeps them there, whatever the config's source (config.toml, config.pbtxt,
a load request's override)."""

from __future__ import annotations

from pathlib import Path

from reposerve.errors import ConfigError


def inside_model_folder(folder: Path, name: str, key: str) -> Path:
    """``folder/name``, refused when it would point outside the model folder: an absolute
    name, ``..`` out of it, or a symlink that leads out. The refusal names ``key`` and
    ``name`` only, so it tells nothing of what lies outside."""
    path = (folder / name).resolve()
    if Path(name).is_absolute() or not path.is_relative_to(folder.resolve()):
        raise ConfigError(f'{key}: "{name}" must be a file inside the model folder')
    return path
