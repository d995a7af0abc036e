"""Run the image on this machine as a cluster would: a read-only root file system, the
image's own user, entrypoint and environment, writable tmpfs only where the server writes.

``podman run`` cannot start a container here (crun may not set its resource limits), so the
container is buildah's: a working container from the image, run with ``buildah run
--isolation chroot`` on the host's network. buildah has no read-only flag; its root is
mounted read-only before the run instead. The engine puts files of its own under /run
(``.containerenv``), so /run is a tmpfs first, as a runtime's /run is."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tools.bench.servers import children_of
from tools.image.engine import EngineError

# what the server writes: temporary files, and the cache the image's REPOSERVE_CACHE_DIR
# names (ONNX graphs converted to fp16, compiled torch programs)
WRITABLE = ("/tmp", "/home/reposerve/.cache")


class ReadOnlyContainer:
    """The image's entrypoint with ``args``, under buildah, on a read-only root; its output
    goes to ``log``. ``stop`` sends the entrypoint SIGTERM and waits; ``close`` removes the
    container."""

    def __init__(self, image: str, args: Sequence[str], log: Path) -> None:
        buildah = shutil.which("buildah")
        if buildah is None:
            raise EngineError("buildah is not on PATH. Hint: apt-get install buildah")
        self._buildah = buildah
        self.name = self._output("from", "--pull-never", image)
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self._root = Path(self._output("mount", self.name))
            self._mount(
                "-t", "tmpfs", "-o", "mode=755,nosuid,nodev", "tmpfs", str(self._root / "run")
            )
            for path in WRITABLE:  # their mount points, in the container's own layer
                (self._root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
            self._mount("-o", "remount,ro", str(self._root))
            described = json.loads(self._output("inspect", self.name))
            entrypoint = described["OCIv1"]["config"]["Entrypoint"]
            tmpfs = [f"--mount=type=tmpfs,destination={path}" for path in WRITABLE]
            command = [buildah, "run", "--isolation", "chroot", "--network", "host", *tmpfs,
                       self.name, "--", *entrypoint, *args]  # fmt: skip
            with open(log, "wb") as output:
                self._process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        except BaseException:
            self.close()
            raise

    @property
    def process(self) -> subprocess.Popen[bytes]:
        assert self._process is not None, "started in __init__"
        return self._process

    def main_pid(self) -> int:
        """The container's main process (the entrypoint's), as the host sees it: chroot
        isolation makes no pid namespace. buildah-chroot-exec starts it as its child."""
        pending = [self.process.pid]
        while pending:
            pid = pending.pop()
            children = children_of(pid)
            if _command(pid)[:1] == [b"buildah-chroot-exec"] and children:
                return children[0]
            pending += children
        raise EngineError("the container has no main process (it has not started, or exited)")

    def stop(self, timeout: float) -> int:
        """SIGTERM to the main process, as a runtime stops a container (buildah would
        SIGKILL it on a SIGTERM of its own), then up to ``timeout`` seconds for the exit;
        the exit status, or a kill and TimeoutError past it."""
        os.kill(self.main_pid(), signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise TimeoutError(
                f"the container did not exit within {timeout} s of SIGTERM"
            ) from None

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._root is not None:
            subprocess.run(["umount", str(self._root / "run")], capture_output=True)
        subprocess.run([self._buildah, "rm", self.name], capture_output=True)

    def _output(self, *args: str) -> str:
        done = subprocess.run([self._buildah, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise EngineError(f"buildah {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    @staticmethod
    def _mount(*args: str) -> None:
        done = subprocess.run(["mount", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise EngineError(f"mount {' '.join(args)} failed: {done.stderr.strip()}")


def _command(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:  # it has exited
        return []
