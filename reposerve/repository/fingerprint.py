"""What a model folder looks like on disk, cheaply: each file's name, size and
modification time. Poll mode reloads a model whose fingerprint changed; on-demand loading
keeps a failed load's answer until its fingerprint changes (``manager.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(folder: Path) -> Fingerprint:
    entries = []
    for path in folder.rglob("*"):
        if "__pycache__" in path.parts:
            continue
        try:
            stat = path.stat()
        except OSError:  # removed while we looked: the next look sees the rest
            continue
        if path.is_file():
            entries.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))


def model_fingerprint(roots: Sequence[Path], name: str) -> tuple[Fingerprint, ...]:
    """The fingerprint of each folder ``name`` in ``roots`` (a name in two repositories
    has both, so either changing counts)."""
    return tuple(fingerprint(root / name) for root in roots if (root / name).is_dir())
