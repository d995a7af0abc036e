"""Starting an instance process: its environment (threads, the GPU it sees, where
reposerve is), the command, and the cores it is pinned to."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import reposerve
from reposerve.instance.spec import InstanceSpec

_PACKAGE_ROOT = str(Path(reposerve.__file__).resolve().parent.parent)
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def spawn(spec: InstanceSpec, socket_fd: int) -> subprocess.Popen:
    """``python -m reposerve.instance.worker FD`` for ``spec``, its end of the socket
    passed as ``socket_fd``; pinned to the spec's cores, if it names any."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
    for variable in _THREAD_VARIABLES:
        env[variable] = str(spec.threads)
    if spec.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = spec.gpu.uuid
    elif spec.kind == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    process = subprocess.Popen(
        [sys.executable, "-m", "reposerve.instance.worker", str(socket_fd)],
        pass_fds=[socket_fd],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    if spec.cpus:
        _pin(process.pid, spec.cpus)
    return process


def _pin(pid: int, cpus: Sequence[int]) -> None:
    """Pin every thread of process ``pid`` to ``cpus``, before its backend loads.

    Popen returns once the child has exec'd, so the interpreter is only starting: the main
    thread goes first, and the threads it starts from then on (BLAS pools, intra-op
    threads) inherit its cores; the sweep catches any it started already.
    """
    # A process that died at once fails its load anyway: nothing to pin then.
    with contextlib.suppress(ProcessLookupError, FileNotFoundError):
        os.sched_setaffinity(pid, cpus)
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.sched_setaffinity(int(task), cpus)
