"""Writing a file so that no reader ever sees half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_atomically(target: Path, content: bytes) -> None:
    """Write ``content`` under a temporary name beside ``target``, flush it to disk and
    rename it over ``target``: readers see the old file or the new one, and a crash
    leaves no broken file behind. The file keeps ``target``'s mode."""
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        # mkstemp makes the file owner-only: keep the mode the old file had (or the one a
        # new file gets), or a server running as another user could no longer read it.
        if target.exists():
            mode = target.stat().st_mode & 0o7777
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
