"""Several model repositories served as one (``--model-repository`` given more than once).

A model is named by its folder, wherever it is; a name that is a folder in two
repositories is an error for that model (which copy would serve is not ours to guess),
naming both paths, until one of them goes. The other models serve.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from reposerve.errors import ConfigError
from reposerve.repository.scan import check_model_folder, is_model_name, model_names


def all_model_names(roots: Sequence[Path]) -> list[str]:
    """Every model folder name in any of ``roots``, sorted, each once."""
    return sorted({name for root in roots for name in model_names(root)})


def check_exists(roots: Sequence[Path], name: str) -> list[Path]:
    """The repositories holding a folder ``name``; ConfigError when it is not a model
    name or no repository has it."""
    if not is_model_name(name) or len(roots) == 1:
        check_model_folder(roots[0], name)  # its error says why
        return [roots[0]]
    holding = [root for root in roots if (root / name).is_dir()]
    if not holding:
        listed = ", ".join(str(root) for root in roots)
        raise ConfigError(f"{name}: no such model folder in {listed}")
    return holding


def find_root(roots: Sequence[Path], name: str) -> Path:
    """The one repository holding model ``name``; ConfigError when none or several do."""
    holding = check_exists(roots, name)
    if len(holding) > 1:
        paths = " and ".join(str(root / name) for root in holding)
        raise ConfigError(
            f"{name}: the model is in more than one repository ({paths}). Hint: rename or "
            "remove all but one; until then it does not load"
        )
    return holding[0]
