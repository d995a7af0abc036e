"""The base image the Dockerfile builds on. The registry's (python:3.11-slim) when it can be
pulled or is already here; else, for that default only, a stand-in made from Debian's own
packages: mmdebstrap bootstraps bookworm (its Python is 3.11, as the registry base's) with
python3, python3-venv and ca-certificates into a tar the engine imports."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from tools.image.engine import Engine, EngineError

REGISTRY_BASE = "python:3.11-slim"
DEBIAN_BASE = "localhost/reposerve-base:bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# documentation and translations: nothing the server reads, a fifth of the tree
LEFT_OUT = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*")
# about 2 minutes on these machines; the bound only turns a stalled mirror into an error
BOOTSTRAP_TIMEOUT_S = 1800


def ensure_base(engine: Engine, base: str, mirror: str = DEBIAN_MIRROR) -> str:
    """The base to build on: ``base`` when the engine has it or can pull it, else (for the
    registry default) the Debian base, made once. Raises EngineError saying why not."""
    if engine.labels(base) is not None:
        return base
    refused = engine.pull(base)
    if refused is None:
        return base
    if base != REGISTRY_BASE:
        raise EngineError(f"the base {base} cannot be pulled: {refused}")
    if engine.labels(DEBIAN_BASE) is None:
        make_debian_base(engine, mirror, why=f"{base} cannot be pulled ({refused})")
    return DEBIAN_BASE


def make_debian_base(engine: Engine, mirror: str, why: str) -> None:
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise EngineError(
            f"{why}, and mmdebstrap, which makes a Debian base instead, is not on PATH. "
            "Hint: apt-get install mmdebstrap, or give a base that can be pulled (BASE=...)"
        )
    print(f"{why}: making {DEBIAN_BASE} from Debian {DEBIAN_SUITE} with mmdebstrap", flush=True)
    with tempfile.TemporaryDirectory(prefix="reposerve-base-") as folder:
        archive = Path(folder) / "root.tar"
        command = [
            mmdebstrap,
            "--variant=minbase",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            *(f"--dpkgopt=path-exclude={path}" for path in LEFT_OUT),
            DEBIAN_SUITE,
            str(archive),
            mirror,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=BOOTSTRAP_TIMEOUT_S)
        if done.returncode != 0:
            raise EngineError(f"mmdebstrap failed: {done.stderr.strip()[-2000:]}")
        engine.import_root(archive, DEBIAN_BASE)
