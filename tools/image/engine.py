"""The container engine that builds and holds images: docker, podman or buildah, found on
PATH in that order (or named). What differs between them lives here: the build command,
whether a build may mount host folders, and where an image's labels are in ``inspect``."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ENGINES = ("docker", "podman", "buildah")
# Pulling a base is bounded so an unreachable registry (no DNS, a firewall that drops) is
# an answer, not a hang; a real pull of a slim base takes well under it.
PULL_TIMEOUT_S = 300


class EngineError(Exception):
    """No engine, or an engine command that failed; the message says which and why."""


@dataclass(frozen=True)
class Engine:
    name: str
    path: str

    @property
    def mounts_in_builds(self) -> bool:
        """podman and buildah bind host folders into a build's RUN steps (``--volume``);
        docker's build has no such option."""
        return self.name != "docker"

    def build_command(self) -> list[str]:
        if self.name == "buildah":
            # chroot isolation: no user namespaces or cgroups needed (these machines lack
            # them); the docker format keeps SHELL and HEALTHCHECK, which OCI drops
            return [self.path, "bud", "--isolation", "chroot", "--format", "docker", "--layers"]
        if self.name == "podman":
            return [self.path, "build", "--isolation", "chroot", "--format", "docker"]
        return [self.path, "build"]

    def labels(self, image: str) -> dict[str, str] | None:
        """The image's labels; None when there is no such image."""
        described = self._describe(image)
        return None if described is None else described[1]

    def image_id(self, image: str) -> str | None:
        """The image's id (a digest of its configuration); None when there is no such image."""
        described = self._describe(image)
        return None if described is None else described[0]

    def _describe(self, image: str) -> tuple[str, dict[str, str]] | None:
        # each engine's whole description (their --format templates differ), read here
        if self.name == "buildah":
            command = [self.path, "inspect", "--type", "image", image]
        else:
            command = [self.path, "image", "inspect", image]
        found = subprocess.run(command, capture_output=True, text=True)
        if found.returncode != 0:
            return None
        described = json.loads(found.stdout)
        if self.name == "buildah":
            return described["FromImageID"], described["OCIv1"]["config"].get("Labels") or {}
        (first,) = described
        return first["Id"], first["Config"].get("Labels") or {}

    def size(self, image: str) -> str:
        """The image's size as the engine reports it (``6.62 GB``)."""
        if self.name == "buildah":
            # buildah gives no bytes, only its own rounding
            (listed,) = json.loads(self._output([self.path, "images", "--json", image]))
            return str(listed["size"])
        size = int(self._output([self.path, "image", "inspect", "--format", "{{.Size}}", image]))
        return f"{size / 1e9:.2f} GB"

    def pull(self, image: str) -> str | None:
        """Pull ``image``; None when done, else why not (the engine's last line)."""
        command = [self.path, "pull", image]
        try:
            pulled = subprocess.run(command, capture_output=True, text=True, timeout=PULL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"no answer in {PULL_TIMEOUT_S} s"
        if pulled.returncode == 0:
            return None
        lines = pulled.stderr.strip().splitlines() or [f"exit status {pulled.returncode}"]
        return lines[-1]

    def import_root(self, archive: Path, image: str) -> None:
        """An image of one layer from a root file system archive (a tar)."""
        if self.name == "buildah":
            # buildah has no import: a container from scratch with the tree added, committed
            container = self._output([self.path, "from", "scratch"])
            try:
                self._output([self.path, "add", container, str(archive), "/"])
                self._output([self.path, "commit", "--format", "docker", container, image])
            finally:
                self._output([self.path, "rm", container])
            return
        self._output([self.path, "import", str(archive), image])

    def _output(self, command: list[str]) -> str:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise EngineError(f"{' '.join(command)} failed: {done.stderr.strip()}")
        return done.stdout.strip()


def find_engine(name: str | None = None) -> Engine:
    """``name`` if given, else the first of docker, podman, buildah on PATH that answers
    ``info`` (a docker client without a daemon does not)."""
    refusals = []
    for candidate in (name,) if name else ENGINES:
        path = shutil.which(candidate)
        if path is None:
            refusals.append(f"{candidate} is not on PATH")
            continue
        try:
            probe = subprocess.run([path, "info"], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            refusals.append(f"{candidate} info gave no answer in 60 s")
            continue
        if probe.returncode == 0:
            return Engine(candidate, path)
        lines = probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"]
        refusals.append(f"{candidate} info failed: {lines[-1]}")
    raise EngineError(
        f"no container engine works: {'; '.join(refusals)}. "
        "Hint: on Debian, apt-get install buildah podman"
    )
