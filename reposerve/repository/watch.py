"""Poll mode (``--model-control-mode poll``): keep the served models in step with the disk.

Every ``--repository-poll-secs`` the repository folders are fingerprinted (each model
folder's file names, sizes and modification times); a model whose fingerprint changed is
reloaded (the new version swaps in only once READY), a new folder is loaded, and a folder
that went away is unloaded. A name in two repositories has both folders in its
fingerprint: it fails to load (naming both) until one goes, and then loads from the other.
Remote repositories are pulled into their cache folders first; a pull that fails is logged
and their last copies stay as they are (so nothing of theirs reloads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

from reposerve.errors import ConfigError, RepositoryError
from reposerve.repository.fingerprint import Fingerprint, model_fingerprint
from reposerve.repository.manager import Repository
from reposerve.repository.roots import all_model_names

log = logging.getLogger("reposerve.repository")


def snapshot(roots: Sequence[Path]) -> dict[str, tuple[Fingerprint, ...]]:
    return {name: model_fingerprint(roots, name) for name in all_model_names(roots)}


class RepositoryWatcher:
    def __init__(self, repository: Repository, interval: float) -> None:
        self._repository = repository
        self._interval = interval

    async def run(self, baseline: dict[str, tuple[Fingerprint, ...]]) -> None:
        """Poll until cancelled; ``baseline`` is what the start-up load saw."""
        known = baseline
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self._repository.mirrors.pull()
            except RepositoryError as exc:
                log.error("poll: %s", exc.message)
            current = await asyncio.to_thread(snapshot, self._repository.roots)
            changed = [name for name, print_ in current.items() if known.get(name) != print_]
            removed = [name for name in known if name not in current]
            for name in changed:
                log.info("poll: %s %s", "loading" if name not in known else "reloading", name)
                # logged and kept in the index (a budget's refusal: its reason)
                with contextlib.suppress(ConfigError, RepositoryError):
                    await self._repository.load(name)
            for name in removed:
                log.info("poll: unloading %s (its folder is gone)", name)
                with contextlib.suppress(RepositoryError):  # it was never loaded
                    await self._repository.unload(name)
            known = current
