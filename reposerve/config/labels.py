"""Class labels of outputs (``[[output]] label_filename``), read once when a model loads.

A label file lives in the model folder, one label per line: line ``i`` names class ``i``
of the output (Triton's classification extension answers ``value:index:label``). When the
output's per-item size is fixed, the file must name every class, so a short file is a
load error rather than answers that quietly lose their labels.
"""

from __future__ import annotations

import math
from pathlib import Path

from reposerve.config.confined import inside_model_folder
from reposerve.config.schema import ModelConfig
from reposerve.errors import ConfigError


def read_labels(folder: Path, config: ModelConfig, label: str) -> dict[str, tuple[str, ...]]:
    """Output name -> its labels, for the outputs that name a label file; ``label`` is how
    errors name the config file."""
    labels: dict[str, tuple[str, ...]] = {}
    for index, output in enumerate(config.output):
        if output.label_filename is None:
            continue
        key = f"{label}: output[{index}].label_filename"
        path = inside_model_folder(folder, output.label_filename, key)
        try:
            lines = tuple(path.read_text(encoding="utf-8").splitlines())
        except FileNotFoundError:
            raise ConfigError(
                f'{key}: "{output.label_filename}" does not exist in the model folder'
            ) from None
        except OSError as exc:
            raise ConfigError(f'{key}: cannot read "{output.label_filename}": {exc}') from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f'{key}: "{output.label_filename}" is not UTF-8 text: {exc.reason}'
            ) from exc
        classes = class_count(output.shape)
        if classes is not None and len(lines) < classes:
            raise ConfigError(
                f'{key}: "{output.label_filename}" has {len(lines)} lines, but output '
                f"'{output.name}' has {classes} classes. Hint: one label per line, in "
                "class order"
            )
        labels[output.name] = lines
    return labels


def class_count(shape: list[int]) -> int | None:
    """Classes per item of an output of this (per-item) shape; None while a dim is -1."""
    return None if any(dim < 0 for dim in shape) else math.prod(shape)
