"""Variable-length batching: which requests may share a padded batch, the batch's inputs
padded (with each request's length, when the model asks for it), and outputs cut back.

A request's key (``key``) leaves out the -1 dims of its padded inputs, so requests of
different lengths share one; with ``buckets`` the key holds the bucket of each of those
dims, so a batch pads at most to its buckets. A request with a dim past the largest bucket
runs alone, as long as it is (no padding, no batch to share). Among the requests that may
join the oldest one, those of the nearest lengths go first (``closest``), so padding stays
small; without buckets none joins that is more than twice as long, along any padded dim,
as another. Settings and their rules: ``reposerve.config.padding``.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

import numpy as np

from reposerve.config import ModelConfig
from reposerve.datatypes import NUMPY_DTYPES, to_numpy, to_wire
from reposerve.instance.outcomes import BatchTensor, PartUnreadable
from reposerve.protocol.request import InferRequest
from reposerve.tensor import FileUnreadable, FileWindow, Tensor


class PaddedBatch:
    """What padding a batch did: elements of the padded inputs, and how many were pad."""

    __slots__ = ("elements", "padding")

    def __init__(self) -> None:
        self.elements = 0
        self.padding = 0


class Padding:
    def __init__(self, config: ModelConfig) -> None:
        batching = config.dynamic_batching
        assert batching is not None and batching.pad  # from_config's caller checks
        self.values = dict(batching.pad)
        # input -> the request tensor's axes that vary (its first: the length)
        self.axes = {
            tensor.name: _variable(tensor.shape)
            for tensor in config.input
            if tensor.name in self.values
        }
        self.source = next(iter(self.axes))  # the first padded input gives the length
        self.buckets = tuple(batching.buckets)
        self.lengths_input = batching.lengths_input
        self.lengths_dtype = NUMPY_DTYPES[batching.lengths_datatype]
        self.lengths_datatype = batching.lengths_datatype
        outputs = {tensor.name: tensor for tensor in config.output}
        # output -> (the input it is cut back to, (output axis, that input's axis) for each
        # of its -1 dims, paired in order with the input's: every padded dim is cut back;
        # an output's -1 dims past the input's are its own, not padding)
        self.unpad = {
            output: (
                source,
                tuple(zip(_variable(outputs[output].shape), self.axes[source], strict=False)),
            )
            for output, source in batching.unpad.items()
        }
        self._alone = itertools.count()

    @classmethod
    def from_config(cls, config: ModelConfig) -> Padding | None:
        batching = config.dynamic_batching
        return cls(config) if batching is not None and batching.pad else None

    def length(self, request: InferRequest, name: str | None = None) -> int:
        """The length of ``request``'s padded input ``name`` (the first's by default)."""
        name = name or self.source
        return request.inputs[name].shape[self.axes[name][0]]

    def sizes(self, request: InferRequest) -> tuple[int, ...]:
        """Every padded dim of ``request``, the length first."""
        return tuple(
            request.inputs[name].shape[axis] for name, axes in self.axes.items() for axis in axes
        )

    def key(self, request: InferRequest) -> tuple:
        """What requests sharing a batch have in common: shapes but for the padded dims,
        and with buckets, the bucket of each padded dim (a request with one past them
        all: a key of its own)."""
        parts: list[tuple] = []
        for name, tensor in request.inputs.items():
            axes = self.axes.get(name, ())
            shape = tuple(
                None if axis in axes else dim for axis, dim in enumerate(tensor.shape) if axis
            )
            parts.append((name, shape))
        if self.buckets:
            buckets = tuple(bisect.bisect_left(self.buckets, n) for n in self.sizes(request))
            if len(self.buckets) in buckets:
                parts.append(("alone", next(self._alone)))  # batches with nobody
            else:
                parts.append(("buckets", buckets))
        return tuple(parts)

    @staticmethod
    def alone(key: tuple) -> bool:
        """Whether requests of ``key`` run alone (a dim past the largest bucket)."""
        return key[-1][0] == "alone"

    def closest(self, head: Sequence[int], candidates: Sequence[Sequence[int]]) -> list[int]:
        """Indices into ``candidates`` (the ``sizes`` of the requests that may join the
        one of ``head``, oldest first), nearest its length first, the older first among
        equals. Without buckets no dim of a batch is more than twice as long as in another
        of its requests (those that would break that are left out), so padding never more
        than doubles a batch's size along a dim."""
        length = head[0]
        order = sorted(range(len(candidates)), key=lambda i: abs(candidates[i][0] - length))
        if self.buckets:  # the buckets bound the padding
            return order
        chosen: list[int] = []
        shortest, longest = list(head), list(head)
        for index in order:
            sizes = candidates[index]
            low = [min(a, b) for a, b in zip(shortest, sizes, strict=True)]
            high = [max(a, b) for a, b in zip(longest, sizes, strict=True)]
            if all(h <= 2 * lo for lo, h in zip(low, high, strict=True)):
                chosen.append(index)
                shortest, longest = low, high
        return chosen

    def target(self, sizes: Sequence[int]) -> int:
        """What a padded dim is padded to: the longest, or its bucket."""
        longest = max(sizes)
        at = bisect.bisect_left(self.buckets, longest)
        return self.buckets[at] if at < len(self.buckets) else longest

    def inputs(
        self, requests: Sequence[InferRequest], count: int, padded: PaddedBatch
    ) -> list[BatchTensor]:
        """The batch's inputs (``count`` rows): padded ones filled out to a common shape,
        and the lengths input last."""
        first = requests[0]
        tensors = []
        for name, tensor in first.inputs.items():
            axes = self.axes.get(name)
            parts = [request.inputs[name] for request in requests]
            if axes is None:
                tensors.append(
                    BatchTensor(
                        name,
                        tensor.datatype,
                        (count, *tensor.shape[1:]),
                        [part.raw for part in parts],
                    )
                )
                continue
            shape = list(tensor.shape)
            for axis in axes:
                shape[axis] = self.target([part.shape[axis] for part in parts])
            filled = []
            for index, part in enumerate(parts):
                try:
                    filled.append(_padded(part, shape[1:], self.values[name], padded))
                except FileUnreadable as exc:  # that request fails, the rest go on
                    raise PartUnreadable(index, f"input '{name}': {exc}") from exc
            tensors.append(BatchTensor(name, tensor.datatype, (count, *shape[1:]), filled))
        if self.lengths_input is not None:
            lengths = [
                np.full((request.batch_size, 1), self.length(request), self.lengths_dtype)
                for request in requests
            ]
            tensors.append(
                BatchTensor(
                    self.lengths_input,
                    self.lengths_datatype,
                    (count, 1),
                    [array.data.cast("B") for array in lengths],
                )
            )
        return tensors

    def cut(self, request: InferRequest, outputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """``request``'s outputs, those in ``unpad`` cut back to its own sizes along every
        padded dim."""
        for name, (source, pairs) in self.unpad.items():
            tensor = outputs.get(name)
            if tensor is None:
                continue
            sizes = request.inputs[source].shape
            keep = {
                axis: sizes[own]
                for axis, own in pairs
                if axis < len(tensor.shape) and tensor.shape[axis] > sizes[own]
            }
            if not keep:
                continue
            array = to_numpy(tensor.datatype, tensor.shape, tensor.memory())
            kept = array[tuple(slice(0, keep.get(axis)) for axis in range(array.ndim))]
            outputs = {
                **outputs,
                name: Tensor(tensor.datatype, kept.shape, to_wire(tensor.datatype, kept)),
            }
        return outputs


def _variable(shape: Sequence[int]) -> tuple[int, ...]:
    """The axes of a request's tensor (the batch's first) where ``shape`` has a -1."""
    return tuple(i + 1 for i, dim in enumerate(shape) if dim == -1)


def _padded(
    part: Tensor, shape: Sequence[int], value: float, padded: PaddedBatch
) -> bytes | memoryview | FileWindow:
    """``part`` (one request's rows) filled out with ``value`` to rows of ``shape``."""
    rows = part.shape[0]
    total = rows * int(np.prod(shape))
    own = int(np.prod(part.shape))
    padded.elements += total
    if own == total:
        return part.raw
    padded.padding += total - own
    raw = part.raw.read() if isinstance(part.raw, FileWindow) else part.raw
    out = np.full((rows, *shape), value, NUMPY_DTYPES[part.datatype])
    out[tuple(slice(0, dim) for dim in part.shape)] = to_numpy(part.datatype, part.shape, raw)
    return out.data.cast("B")
