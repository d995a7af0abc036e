"""Variable-length batching in a config: ``pad``, ``buckets``, ``lengths_input`` and
``unpad`` under ``[dynamic_batching]``, the rules they must keep, and the input the model
gets that clients never send (``lengths_input``).

A padded input is one whose declared shape has a -1: requests that differ only in those
dims share a batch, each padded with the input's ``pad`` value up to the longest in the
batch, or to the next of ``buckets`` along each -1 dim (``reposerve.scheduler.padding``
does it). Its first -1 dim is its length: what ``lengths_input`` reports (from the first
padded input, in declaration order). ``unpad`` cuts every -1 dim of an output back to the
request's own size of the input's -1 dim in the same place in order (the output's first
to the input's first, its second to the second). A batch padded to the largest bucket
along every -1 dim must fit in ``MAX_PADDED_BATCH`` bytes: past that a bucket could only
fail the requests padded to it (or exhaust the host's memory), so the config is refused.
"""

from __future__ import annotations

import math

import numpy as np

from reposerve.config.schema import ModelConfig, TensorConfig
from reposerve.datatypes import NUMPY_DTYPES

# Padding writes the pad value into elements: types numpy holds as numbers.
_UNPADDABLE = {"BYTES", "BF16"}
# The padded inputs of one batch padded to the largest bucket, at most: the largest
# message either front takes (gRPC's 2 GiB limit), so a batch is never larger than a
# request the server would take whole.
MAX_PADDED_BATCH = (1 << 31) - 1


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
    if batching.buckets:
        padded = [inputs[name] for name in batching.pad]
        rows = max(config.max_batch_size, 1)
        problem = _check_largest_bucket(padded, batching.buckets[-1], rows)
        if problem:
            return f"{where}.buckets: {problem}"
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


def _check_largest_bucket(padded: list[TensorConfig], largest: int, rows: int) -> str | None:
    """Whether a batch of ``rows`` of the ``padded`` inputs, padded to the ``largest``
    bucket along every -1 dim, fits in ``MAX_PADDED_BATCH``."""
    size = sum(
        rows
        * math.prod(largest if dim == -1 else dim for dim in tensor.shape)
        * np.dtype(NUMPY_DTYPES[tensor.datatype]).itemsize
        for tensor in padded
    )
    if size <= MAX_PADDED_BATCH:
        return None
    tensors = " and ".join(f'input "{t.name}" {t.datatype} {t.shape}' for t in padded)
    return (
        f"a batch of {rows} padded to the largest ({largest}) along every -1 dim of "
        f"{tensors} takes {size} bytes, past the {MAX_PADDED_BATCH} a padded batch may "
        "take. Hint: make the largest bucket smaller; a request longer than it runs alone, "
        "unpadded"
    )


def _check_value(value: float, datatype: str) -> str | None:
    """Whether ``value`` is one of ``datatype``'s values (padding writes it as one)."""
    if datatype == "BOOL":
        fits = value in (0, 1)
    elif datatype.startswith(("INT", "UINT")):
        limits = np.iinfo(NUMPY_DTYPES[datatype])
        fits = float(value).is_integer() and limits.min <= value <= limits.max
    else:  # a finite value past the type's range would turn into inf
        fits = not math.isfinite(value) or bool(abs(value) <= np.finfo(NUMPY_DTYPES[datatype]).max)
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
