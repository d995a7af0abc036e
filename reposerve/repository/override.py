"""Model folders made from a load request's files (Triton's ``file:`` load parameters).

The files form the whole model folder for that load, as in Triton: they are written to a
fresh temporary repository holding just this model, the versions load from there, and the
folder is removed once no version of the model runs from it any more (a later load, an
unload, the shutdown).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path


class OverrideFolder:
    """A temporary repository ``root`` with one model folder, ``root / name``."""

    def __init__(self, name: str, files: Mapping[str, bytes]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"reposerve-{name}-"))
        try:
            for relative, content in files.items():
                path = self.root / name / relative  # relative paths, checked when decoded
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
        except BaseException:
            self.remove()
            raise

    def holds(self, path: Path) -> bool:
        return path.is_relative_to(self.root)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
