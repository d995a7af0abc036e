"""Writing a file so that no reader ever sees half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_atomically(target: Path, content: bytes) -> None:
    """Write ``content`` under a temporary name beside ``target``, flush it to disk and
    rename it over ``target``: readers see the old file or the new one, and a crash
    leaves no broken file behind."""
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
