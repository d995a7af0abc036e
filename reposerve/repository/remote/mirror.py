"""One remote repository's copy in the local cache, and the pull that brings it up to date.

The cache folder of a repository (one per URL) holds::

    models/<name>     -> snapshots/<name>.<token>   what the server serves (a symlink each)
    snapshots/        each model's copy, as downloaded; never written once in place
    manifest.json     each model's objects (path, size, ETag) as its copy holds them
    lock              held while a pull runs (two servers on one cache take turns)

A pull lists the bucket once. A model whose objects (path, size, ETag) are the manifest's
is kept as it is, across restarts too; a changed one is downloaded whole into a fresh
folder, checked, and swapped in by replacing its symlink (one rename), so a reader sees the
old copy or the new one, never a half; a model gone from the bucket goes. Whatever fails
(a lost connection, the size bound) leaves every model's last good copy in place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import msgspec

from reposerve.backends.file_cache import exclusive
from reposerve.errors import ErrorKind, RepositoryError
from reposerve.files import replace_atomically
from reposerve.locations import RemoteRepository
from reposerve.repository.remote.filesystems import open_filesystem
from reposerve.repository.residency import describe_bytes
from reposerve.repository.scan import is_model_name

log = logging.getLogger("reposerve.repository")


class RemoteObject(msgspec.Struct, frozen=True, array_like=True, order=True):
    path: str  # inside the model folder, "/"-separated
    size: int
    tag: str  # ETag (or the store's hash or modification time): changes with the content


class ModelCopy(msgspec.Struct, frozen=True):
    folder: str  # its snapshot: snapshots/<folder>
    objects: tuple[RemoteObject, ...]


class Manifest(msgspec.Struct, frozen=True):
    url: str
    models: dict[str, ModelCopy] = {}


class Pulled(msgspec.Struct, frozen=True):
    """What one pull did, by model name."""

    copied: list[str]
    kept: list[str]
    removed: list[str]
    copied_bytes: int


_manifest_decoder = msgspec.json.Decoder(Manifest)


def cache_folder(cache_dir: Path, location: RemoteRepository) -> Path:
    """The cache folder of ``location``: named for people, keyed by the whole URL (an
    endpoint's bucket is not AWS's)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{location.scheme}-{location.root}")[:80]
    key = hashlib.sha256(location.url.encode()).hexdigest()[:12]
    return cache_dir / f"{readable}-{key}"


class Mirror:
    """``location``'s copy under ``folder``; ``max_bytes``: the most its objects may hold
    (None: no bound); ``environ``: what ``filesystems`` maps (an S3 endpoint, Azure's
    variables); botocore and google-auth read the process's environment themselves."""

    def __init__(
        self,
        location: RemoteRepository,
        folder: Path,
        max_bytes: int | None,
        environ: Mapping[str, str],
    ) -> None:
        self.location = location
        self.folder = folder
        self.max_bytes = max_bytes
        self._environ = environ
        # Kept between pulls (a client takes a second to build); dropped when one fails,
        # so the next starts on fresh connections.
        self._filesystem: Any = None
        self.root = folder / "models"  # the repository folder the server reads
        self._snapshots = folder / "snapshots"
        self._manifest_path = folder / "manifest.json"
        for path in (self.root, self._snapshots):
            path.mkdir(parents=True, exist_ok=True)

    def pull(self, names: Collection[str] | None = None) -> Pulled:
        """Bring the copy of ``names`` (None: every model) up to date with the bucket;
        RepositoryError saying what failed (the last good copies stay)."""
        with exclusive(self.folder / "lock"):
            try:
                return self._pull(names)
            except RepositoryError:
                self._filesystem = None
                raise
            except Exception as exc:  # the store's own errors: botocore, aiohttp, OS
                self._filesystem = None
                raise RepositoryError(
                    f"{self.location.url}: cannot read the repository: "
                    f"{type(exc).__name__}: {exc}. The last copy pulled keeps serving",
                    kind=ErrorKind.UNAVAILABLE,
                ) from exc

    def _pull(self, names: Collection[str] | None) -> Pulled:
        if self._filesystem is None:
            self._filesystem = open_filesystem(self.location, self._environ)
        filesystem = self._filesystem
        filesystem.invalidate_cache()  # each pull lists the bucket as it is now
        listing = self._list(filesystem)
        total = sum(o.size for objects in listing.values() for o in objects)
        if self.max_bytes is not None and total > self.max_bytes:
            raise RepositoryError(
                f"{self.location.url}: the repository holds {describe_bytes(total)} "
                f"({total} bytes), over --repository-cache-bytes {self.max_bytes}. Hint: "
                "raise the bound, or serve a prefix holding fewer models",
                kind=ErrorKind.UNAVAILABLE,
            )
        manifest = self._read_manifest()
        models = dict(manifest.models)
        wanted = set(listing) | set(models) if names is None else set(names)
        copied, kept, removed, copied_bytes = [], [], [], 0
        for name in sorted(wanted):
            objects, held = listing.get(name), models.get(name)
            if objects is None:
                if held is not None:
                    self._swap(name, None)
                    del models[name]
                    removed.append(name)
            elif held is not None and held.objects == objects and self._intact(name, held):
                kept.append(name)
                continue
            else:
                models[name] = self._copy(filesystem, name, objects)
                copied.append(name)
                copied_bytes += sum(o.size for o in objects)
            # Written after each change: a pull cut short keeps what it finished.
            self._write_manifest(Manifest(self.location.url, models))
        self._sweep(models)
        return Pulled(copied, kept, removed, copied_bytes)

    def _list(self, filesystem: Any) -> dict[str, tuple[RemoteObject, ...]]:
        """Every object under the prefix that lies inside a model folder, by model."""
        root = self.location.root
        found: dict[str, Any] = filesystem.find(root, detail=True)
        models: dict[str, list[RemoteObject]] = {}
        for path, info in found.items():
            relative = path.removeprefix(root).lstrip("/")
            name, _, inside = relative.partition("/")
            if info.get("type") == "directory" or not inside or not is_model_name(name):
                continue  # a file beside the model folders, or a folder marker
            if any(part in ("", ".", "..") for part in inside.split("/")):
                raise RepositoryError(
                    f"{self.location.url}: object '{relative}' has an empty, '.' or '..' "
                    "segment in its name; it cannot be copied into a folder",
                    kind=ErrorKind.UNAVAILABLE,
                )
            models.setdefault(name, []).append(RemoteObject(inside, int(info["size"]), _tag(info)))
        return {name: tuple(sorted(objects)) for name, objects in models.items()}

    def _copy(self, filesystem: Any, name: str, objects: tuple[RemoteObject, ...]) -> ModelCopy:
        """Download ``name`` whole into a fresh snapshot, check it, swap it in."""
        folder = f"{name}.{uuid.uuid4().hex[:12]}"
        partial = self._snapshots / f".partial-{folder}"
        partial.mkdir()
        try:
            targets = [partial / entry.path for entry in objects]
            for target in targets:
                target.parent.mkdir(parents=True, exist_ok=True)
            sources = [f"{self.location.root}/{name}/{entry.path}" for entry in objects]
            filesystem.get(sources, [str(target) for target in targets])
            for entry, target in zip(objects, targets, strict=True):
                size = target.stat().st_size
                if size != entry.size:
                    raise RepositoryError(
                        f"{self.location.url}: {name}/{entry.path} came with {size} of its "
                        f"{entry.size} bytes. The last copy pulled keeps serving",
                        kind=ErrorKind.UNAVAILABLE,
                    )
            partial.rename(self._snapshots / folder)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        self._swap(name, folder)
        return ModelCopy(folder, objects)

    def _swap(self, name: str, folder: str | None) -> None:
        """Point ``models/name`` at ``snapshots/folder`` in one rename (None: remove it)."""
        link = self.root / name
        if folder is None:
            link.unlink(missing_ok=True)
            return
        fresh = self.root / f".{name}.{uuid.uuid4().hex[:8]}"
        fresh.symlink_to(Path("..") / "snapshots" / folder, target_is_directory=True)
        os.replace(fresh, link)

    def _intact(self, name: str, held: ModelCopy) -> bool:
        """Its snapshot is there and served (a cache pruned by hand is copied again)."""
        link = self.root / name
        return (
            (self._snapshots / held.folder).is_dir()
            and os.path.islink(link)
            and (os.readlink(link) == str(Path("..") / "snapshots" / held.folder))
        )

    def _sweep(self, models: dict[str, ModelCopy]) -> None:
        """Remove the snapshots no model points at (replaced, or left by a pull cut short)."""
        served = {copy.folder for copy in models.values()}
        for entry in self._snapshots.iterdir():
            if entry.name not in served:
                shutil.rmtree(entry, ignore_errors=True)
        for entry in self.root.iterdir():
            if entry.name.startswith("."):  # a symlink a swap left half-made
                entry.unlink(missing_ok=True)

    def _read_manifest(self) -> Manifest:
        try:
            manifest = _manifest_decoder.decode(self._manifest_path.read_bytes())
        except (OSError, msgspec.DecodeError):  # none yet, or not ours: copy afresh
            return Manifest(self.location.url)
        return manifest if manifest.url == self.location.url else Manifest(self.location.url)

    def _write_manifest(self, manifest: Manifest) -> None:
        replace_atomically(self._manifest_path, msgspec.json.encode(manifest))


def _tag(info: Mapping[str, Any]) -> str:
    """What changes when an object's content does, as the store reports it."""
    for key in ("ETag", "etag", "md5Hash", "content_md5", "LastModified", "last_modified", "mtime"):
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return ""
