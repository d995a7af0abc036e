"""Warmup: the ``[[warmup]]`` batches run on every instance, and on every replacement,
before it takes traffic (Triton's behaviour), so no instance serves its first batches cold
(lazy CUDA loading, cuDNN/cuBLAS set-up, per-shape algorithm search).

Each ``[[warmup]]`` entry runs at its own batch size and again at every preferred batch
size of the dynamic batcher: those are the shapes traffic will bring, and cuDNN and
TensorRT pick algorithms per shape. The batches are built once per version and handed
straight to each instance, not through the scheduler, which would send them to whichever
instance is free.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

import numpy as np

from reposerve.config import ModelConfig
from reposerve.datatypes import NUMPY_DTYPES, element_count, pack_bytes
from reposerve.errors import InstanceError
from reposerve.instance.outcomes import (
    BatchFailure,
    BatchOutcome,
    BatchTensor,
    FailureCause,
    outcome_to,
)
from reposerve.instance.process import InstanceProcess
from reposerve.statistics import ModelStatistics


def warmup_batches(config: ModelConfig) -> list[list[BatchTensor]]:
    """The warmup batches in the order they run: per ``[[warmup]]`` entry, its own batch
    size, then each preferred batch size; zeros, or random values valid for each datatype."""
    rng = np.random.default_rng(0)
    batched = config.max_batch_size > 0
    batches = []
    for warmup in config.warmup:
        for size in warmup_sizes(warmup.batch_size, config):
            batch = []
            for spec in config.input:
                kind = warmup.inputs.get(spec.name, "zero")
                dims = tuple(1 if dim < 0 else dim for dim in spec.shape)
                shape = (size, *dims) if batched else dims
                raw = _sample(spec.datatype, shape, kind, rng)
                batch.append(BatchTensor(spec.name, spec.datatype, shape, [raw]))
            batches.append(batch)
    return batches


def warmup_sizes(batch_size: int, config: ModelConfig) -> list[int]:
    """The batch sizes one ``[[warmup]]`` entry runs at (one size without a batch axis)."""
    if config.max_batch_size == 0 or config.dynamic_batching is None:
        return [batch_size]
    preferred = sorted(set(config.dynamic_batching.preferred_batch_size) - {batch_size})
    return [batch_size, *preferred]


async def warm(
    instance: InstanceProcess,
    batches: list[list[BatchTensor]],
    statistics: ModelStatistics,
    label: str,
) -> None:
    """Run every warmup batch on ``instance``; InstanceError naming the one that failed."""
    loop = asyncio.get_running_loop()
    for index, batch in enumerate(batches):
        done: asyncio.Future[BatchOutcome | BatchFailure] = loop.create_future()
        started = time.monotonic_ns()
        instance.run(batch, outcome_to(partial(_settle, done)))
        outcome = await done
        if isinstance(outcome, BatchFailure):
            raise InstanceError(
                f"{label}: warmup[{index}] failed on instance {instance.spec.index}: "
                f"{outcome.message}"
            )
        items = batch[0].shape[0] if batch and batch[0].shape else 1
        elapsed = time.monotonic_ns() - started
        statistics.record_batch(
            items=items,
            requests=1,
            input_ns=0,
            infer_ns=outcome.compute_ns,
            output_ns=0,
            success_ns=elapsed,
            queue_ns=0,
        )


def _settle(
    done: asyncio.Future[BatchOutcome | BatchFailure], outcome: BatchOutcome | BatchFailure
) -> None:
    done.set_result(_keep(outcome))


def _keep(outcome: BatchOutcome | BatchFailure) -> BatchOutcome | BatchFailure:
    """The outcome without its output views, which are valid only during the callback.
    A warmup batch is one request: the model failing it alone fails the warmup."""
    if isinstance(outcome, BatchOutcome):
        if outcome.failed:
            return BatchFailure(outcome.failed[0].message, FailureCause.MODEL)
        return BatchOutcome({}, outcome.compute_ns, outcome.slot)
    return outcome


def _sample(datatype: str, shape: tuple[int, ...], kind: str, rng: np.random.Generator) -> bytes:
    """Warmup data: zeros, or random values valid for every datatype (small ints, [0, 1) floats)."""
    count = element_count(shape)
    if datatype == "BYTES":
        return pack_bytes([b"" if kind == "zero" else rng.bytes(8) for _ in range(count)])
    dtype = NUMPY_DTYPES[datatype]
    if kind == "zero":
        return bytes(count * dtype.itemsize)
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(np.bool_).tobytes()
    if datatype == "BF16":
        floats = rng.random(count, dtype=np.float32)
        return (floats.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    if dtype.kind == "f":
        return rng.random(count).astype(dtype).tobytes()
    return rng.integers(0, 100, count).astype(dtype).tobytes()
