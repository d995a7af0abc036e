"""Variable-length batching in a config: ``pad``, ``buckets``, ``lengths_input`` and
``unpad`` under ``[dynamic_batching]``, the rules they must keep, and the input the model
gets that clients never send (``lengths_input``).

A padded input is one whose declared shape has a -1: requests that differ only in those
dims share a batch, each padded with the input's ``pad`` value up to the longest in the
batch, or to the next of ``buckets`` (``reposerve.scheduler.padding`` does it). Its first
-1 dim is its length: what ``buckets`` round, ``lengths_input`` reports (from the first
padded input, in declaration order) and ``unpad`` cuts an output back to.
"""

from __future__ import annotations

import math

import numpy as np

from reposerve.config.schema import ModelConfig, TensorConfig
from reposerve.datatypes import NUMPY_DTYPES

# Padding writes the pad value into elements: types numpy holds as numbers.
_UNPADDABLE = {"BYTES", "BF16"}


def lengths_tensor(config: ModelConfig) -> TensorConfig | None:
    """The input ``lengths_input`` adds for the model, one value per batch row."""
    batching = config.dynamic_batching
    if batching is None or batching.lengths_input is None:
        return None
    return TensorConfig(name=batching.lengths_input, datatype=batching.lengths_datatype, shape=[1])


def check_padding(config: ModelConfig) -> str | None:
    """The first problem with the padding settings, as ``key: reason``; None when fine."""
    batching = config.dynamic_batching
    if batching is None:
        return None
    where = "dynamic_batching"
    if not batching.pad:
        for key in ("buckets", "lengths_input", "unpad"):
            if getattr(batching, key):
                return f"{where}.{key}: needs {where}.pad (the inputs that are padded)"
        return None
    if config.sequence_batching is not None:
        return f"{where}.pad: not with sequence_batching (a sequence's requests run in order)"
    if batching.preserve_ordering:
        return (
            f"{where}.pad: not with preserve_ordering (padded batches form out of arrival "
            "order, by length)"
        )
    inputs = {tensor.name: tensor for tensor in config.input}
    for name in batching.pad:
        tensor = inputs.get(name)
        if tensor is None:
            return (
                f'{where}.pad: "{name}" is not a declared input. Hint: declare it in '
                "[[input]], with -1 in its shape where lengths vary"
            )
        problem = _check_padded(tensor) or _check_value(batching.pad[name], tensor.datatype)
        if problem:
            return f'{where}.pad: input "{name}" {problem}'
    if batching.buckets != sorted(set(batching.buckets)):
        return f"{where}.buckets: {batching.buckets}: list them in increasing order, once each"
    if batching.lengths_input is not None and batching.lengths_input in inputs:
        return (
            f'{where}.lengths_input: "{batching.lengths_input}" is declared in [[input]]; it '
            "is added for the model (clients do not send it). Hint: remove it from [[input]]"
        )
    outputs = {tensor.name: tensor for tensor in config.output}
    for output, source in batching.unpad.items():
        tensor = outputs.get(output)
        if tensor is None:
            return f'{where}.unpad: "{output}" is not a declared output'
        if -1 not in tensor.shape or tensor.datatype in _UNPADDABLE:
            return (
                f'{where}.unpad: output "{output}" needs a -1 in its shape to cut, and a '
                f"numeric datatype (it is {tensor.datatype} {tensor.shape})"
            )
        if source not in batching.pad:
            return f'{where}.unpad.{output}: "{source}" is not a padded input (see pad)'
    return None


def _check_value(value: float, datatype: str) -> str | None:
    """Whether ``value`` is one of ``datatype``'s values (padding writes it as one)."""
    if datatype == "BOOL":
        fits = value in (0, 1)
    elif datatype.startswith(("INT", "UINT")):
        limits = np.iinfo(NUMPY_DTYPES[datatype])
        fits = float(value).is_integer() and limits.min <= value <= limits.max
    else:  # a finite value past the type's range would turn into inf
        fits = not math.isfinite(value) or abs(value) <= np.finfo(NUMPY_DTYPES[datatype]).max
    if fits:
        return None
    return f"is {datatype}: its pad value {value!r} is not one of its values"


def _check_padded(tensor: TensorConfig) -> str | None:
    if -1 not in tensor.shape:
        return f"has no -1 dim to pad (shape {tensor.shape})"
    if tensor.datatype in _UNPADDABLE:
        return f"is {tensor.datatype}: only numeric inputs are padded"
    if tensor.reshape is not None:
        return "has a reshape: padding is of the shape clients send, so it takes none"
    if tensor.optional:
        return "is optional: every request must carry a padded input (it gives the length)"
    return None
