"""Triton's classification extension: an output answered as its top-K classes.

An output requested with ``parameters.classification = K`` comes back as BYTES of shape
``[batch, min(K, classes)]`` (``[min(K, classes)]`` for a model without a batch
dimension), each element ``"<value>:<index>"`` or ``"<value>:<index>:<label>"``, highest
value first, where ``index`` counts the item's elements in C order and ``label`` is line
``index`` of the output's ``label_filename``. Values are written as Triton writes them
(C's ``std::to_string``: six decimals for floats, plain integers otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reposerve.datatypes import NUMPY_DTYPES, element_count, pack_bytes
from reposerve.tensor import Tensor

# Outputs whose elements are not ordered numbers cannot be ranked.
UNRANKED = frozenset({"BYTES", "BOOL"})


def classify(tensor: Tensor, count: int, batched: bool, labels: Sequence[str]) -> Tensor:
    """The top ``count`` classes of each item of ``tensor`` (every element when not
    ``batched``), as the extension's BYTES tensor."""
    items = tensor.shape[0] if batched and tensor.shape else 1
    values = _values(tensor).reshape(items, -1)
    chosen = _top(values, count)
    float_values = values.dtype.kind == "f"
    strings: list[bytes] = []
    for row, order in zip(values, chosen, strict=True):
        for index in order.tolist():
            value = row[index]
            text = f"{float(value):f}" if float_values else str(int(value))
            text = f"{text}:{index}"
            if index < len(labels):
                text = f"{text}:{labels[index]}"
            strings.append(text.encode())
    shape = (items, chosen.shape[1]) if batched else (chosen.shape[1],)
    return Tensor("BYTES", shape, pack_bytes(strings))


def _values(tensor: Tensor) -> np.ndarray:
    count = element_count(tensor.shape)
    values = np.frombuffer(tensor.memory(), dtype=NUMPY_DTYPES[tensor.datatype], count=count)
    if tensor.datatype == "BF16":  # its bit patterns: widen to the float32 they stand for
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values


def _top(values: np.ndarray, count: int) -> np.ndarray:
    """Per row, the indices of the ``count`` highest values, highest first; among equal
    values the lower index first. The key reverses the order exactly (``~x`` for integers
    never overflows, ``-x`` is exact for floats), so a stable ascending sort of it is a
    stable descending sort of the values."""
    key = -values if values.dtype.kind == "f" else ~values
    order = np.argsort(key, axis=1, kind="stable")
    return order[:, : min(count, values.shape[1])]
