"""Files derived from a model version (an fp16 graph, TensorRT engines), made once on disk.

The instances of a version start together, each in its own process. The first to take a
file's lock builds it; the others wait on the lock, then read what it wrote. A file is
written under a temporary name, flushed and renamed, so a reader never sees half of one
and a crash mid-build leaves no broken entry behind.

Where: ``$REPOSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/reposerve``, else
``~/.cache/reposerve``. Entries are keyed by content, never invalidated in place: deleting
the folder is always safe.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from reposerve.files import replace_atomically

CACHE_DIR_VARIABLE = "REPOSERVE_CACHE_DIR"


def cache_root() -> Path:
    explicit = os.environ.get(CACHE_DIR_VARIABLE)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "reposerve"


def content_digest(path: Path) -> str:
    """The sha256 of a file's bytes, hex; what cache entries derived from it are keyed by."""
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock`` (created, with its folder, if missing).

    ``flock`` locks belong to the open file, so they exclude other processes and other
    threads alike, and the kernel drops them when a holder dies. The lock file stays:
    removing it would let a waiter lock a file no newcomer can see.
    """
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def build_once(target: Path, build: Callable[[], bytes]) -> bool:
    """Make sure ``target`` exists, calling ``build`` for its bytes only if no process has
    yet; True when this call built it. Raises OSError when the cache cannot be written."""
    if target.exists():
        return False
    with exclusive(target.with_name(target.name + ".lock")):
        if target.exists():  # built by whoever held the lock before us
            return False
        replace_atomically(target, build())
    return True
