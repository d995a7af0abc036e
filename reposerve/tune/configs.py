"""The recommended configuration as files: each tuned model's config.toml, its diff from
the folder's, and ``--write``, which replaces the folder's config atomically and keeps
the previous one beside it.

The recommendation starts from the folder's own configuration (when tune can see the
folder) and changes only what the search changed, so what was written by hand stays as
it was; without the folder (``--url``), from the configuration the server serves.
"""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import msgspec

from reposerve.config.load import find_config, load_model_config
from reposerve.config.schema import ModelConfig
from reposerve.config.toml_writer import to_toml
from reposerve.errors import ConfigError, TuneError
from reposerve.files import replace_atomically
from reposerve.tune.results import Settings
from reposerve.tune.space import Knob

KEPT_SUFFIX = ".before-tune"


class Recommendation(msgspec.Struct, frozen=True):
    model: str
    text: str  # the recommended config.toml
    diff: str  # unified diff from the folder's config (or the served one), "" if the same
    folder: Path | None  # where --write puts it


def recommend(
    name: str,
    served: ModelConfig,
    knobs: list[Knob],
    baseline: Settings,
    chosen: Settings,
    folder: Path | None,
) -> Recommendation:
    """``name``'s config with the knobs ``chosen`` changed from ``baseline`` applied."""
    source = find_config(folder) if folder is not None else None
    base = _folder_config(source, name) if source is not None else served
    config = base
    for knob in knobs:
        value = chosen[name][knob.name]
        if value != baseline[name][knob.name] and knob.unusable(config) is None:
            config = knob.write(config, value)
    before = source.read_text() if source is not None and source.suffix == ".toml" else None
    before = before if before is not None else to_toml(base)
    # The file's opening comments (what the model is) stay; to_toml writes no comments.
    opening = "".join(_opening_comments(before)) if source is not None else ""
    text = opening + to_toml(config) if config != base else before
    origin = str(source) if source is not None else f"{name} (served)"
    diff = "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=origin,
            tofile=f"{name}/config.toml (recommended)",
        )
    )
    return Recommendation(name, text, diff, folder)


def _opening_comments(text: str) -> list[str]:
    lines = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def _folder_config(source: Path, name: str) -> ModelConfig:
    try:
        return load_model_config(source, label=f"{name}/{source.name}")
    except ConfigError as exc:
        raise TuneError(exc.message) from None


def write(recommendation: Recommendation) -> Path:
    """Replace the folder's config.toml by the recommended one in one rename; the previous
    config.toml is kept as config.toml.before-tune (a config.pbtxt stays where it is: a
    config.toml is read before it)."""
    folder = recommendation.folder
    if folder is None:
        raise TuneError(f"--write: {recommendation.model}'s folder is not known here")
    target = folder / "config.toml"
    if target.exists():
        shutil.copy2(target, folder / f"config.toml{KEPT_SUFFIX}")
    replace_atomically(target, recommendation.text.encode())
    return target
