"""The server's remote repositories: their cache folders as repository roots, and the pulls
that keep those up to date (at start-up, before each poll looks, before an explicit load).
With no remote repository a pull does nothing."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from reposerve.backends.file_cache import cache_root
from reposerve.errors import ErrorKind, RepositoryError
from reposerve.locations import RemoteRepository
from reposerve.repository.remote.mirror import Mirror, Pulled, cache_folder

log = logging.getLogger("reposerve.repository")


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """Triton's TRITON_AWS_MOUNT_DIRECTORY when set, else ``repositories`` in reposerve's
    cache folder (``$REPOSERVE_CACHE_DIR``, ``$XDG_CACHE_HOME/reposerve``, ...)."""
    if mount := environ.get("TRITON_AWS_MOUNT_DIRECTORY"):
        return Path(mount)
    return cache_root() / "repositories"


class Mirrors:
    """The mirrors of ``remotes`` (in ``cache_dir``, each bounded by ``max_bytes``), and
    ``roots``: every repository as a local folder, ``folders`` first."""

    def __init__(
        self,
        folders: Sequence[Path] = (),
        remotes: Sequence[RemoteRepository] = (),
        cache_dir: Path | None = None,
        max_bytes: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        cache_dir = cache_dir or default_cache_dir(environ)
        self._mirrors = [
            Mirror(remote, cache_folder(cache_dir, remote), max_bytes, environ)
            for remote in remotes
        ]
        self.roots = [folder.resolve() for folder in folders]
        self.roots += [mirror.root for mirror in self._mirrors]
        self._pulling = asyncio.Lock()  # one pull at a time: each lists the whole bucket

    async def pull(self, name: str | None = None) -> None:
        """Bring every mirror's copy of model ``name`` (None: every model) up to date;
        RepositoryError naming each repository that failed (its last copy stays)."""
        if not self._mirrors:
            return
        failures = []
        async with self._pulling:
            for mirror in self._mirrors:
                try:
                    pulled = await asyncio.to_thread(mirror.pull, None if name is None else [name])
                except RepositoryError as exc:
                    failures.append(exc.message)
                    continue
                changed = pulled.copied or pulled.removed  # else quiet: polls come often
                log.log(
                    logging.INFO if changed else logging.DEBUG,
                    "%s: %s",
                    mirror.location.url,
                    _describe(pulled) or "empty",
                )
        if failures:
            raise RepositoryError("; ".join(failures), kind=ErrorKind.UNAVAILABLE)


def _describe(pulled: Pulled) -> str:
    said = []
    if pulled.copied:
        said.append(f"copied {', '.join(pulled.copied)} ({pulled.copied_bytes} bytes)")
    if pulled.kept:
        said.append(f"kept {len(pulled.kept)} unchanged")
    if pulled.removed:
        said.append(f"removed {', '.join(pulled.removed)} (gone from the bucket)")
    return "; ".join(said)
