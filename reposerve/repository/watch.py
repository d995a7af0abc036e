"""Poll mode (``--model-control-mode poll``): keep the served models in step with the disk.

Every ``--repository-poll-secs`` the repository folder is fingerprinted (each model
folder's file names, sizes and modification times); a model whose fingerprint changed is
reloaded (the new version swaps in only once READY), a new folder is loaded, and a folder
that went away is unloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from reposerve.errors import ConfigError, RepositoryError
from reposerve.repository.manager import Repository
from reposerve.repository.scan import model_names

log = logging.getLogger("reposerve.repository")

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(folder: Path) -> Fingerprint:
    entries = []
    for path in folder.rglob("*"):
        if "__pycache__" in path.parts:
            continue
        try:
            stat = path.stat()
        except OSError:  # removed while we looked: the next poll sees the rest
            continue
        if path.is_file():
            entries.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))


def snapshot(root: Path) -> dict[str, Fingerprint]:
    return {name: fingerprint(root / name) for name in model_names(root)}


class RepositoryWatcher:
    def __init__(self, repository: Repository, interval: float) -> None:
        self._repository = repository
        self._interval = interval

    async def run(self, baseline: dict[str, Fingerprint]) -> None:
        """Poll until cancelled; ``baseline`` is what the start-up load saw."""
        known = baseline
        while True:
            await asyncio.sleep(self._interval)
            current = await asyncio.to_thread(snapshot, self._repository.root)
            changed = [name for name, print_ in current.items() if known.get(name) != print_]
            removed = [name for name in known if name not in current]
            for name in changed:
                log.info("poll: %s %s", "loading" if name not in known else "reloading", name)
                with contextlib.suppress(ConfigError):  # logged and kept in the index
                    await self._repository.load(name)
            for name in removed:
                log.info("poll: unloading %s (its folder is gone)", name)
                with contextlib.suppress(RepositoryError):  # it was never loaded
                    await self._repository.unload(name)
            known = current
