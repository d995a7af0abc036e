"""Front processes past the server's own: each serves HTTP and/or gRPC on the server's
ports and runs every call through the server's process, which owns the repository, the
schedulers and the instances (``workers`` starts them, ``core`` serves them, ``remote``
is the service as they see it, ``worker`` is their program)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def default_workers(cores: int) -> int:
    """Fronts for this many cores: one below four (the server's own process, with no
    hop), then one per two cores up to eight, leaving the rest to the server's process,
    the instances and the clients."""
    return 1 if cores < 4 else min(8, cores // 2)


WORKERS_PER_CORE = 4


def max_workers(cores: int) -> int:
    """The most fronts one protocol may have (--http-workers, --grpc-workers): four per
    usable core. Past that they only take turns on the cores, and each is a process that
    has to start before the server is ready and be reaped when it leaves (a thousand
    never all came up)."""
    return WORKERS_PER_CORE * cores
