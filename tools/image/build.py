"""Build the image from the Dockerfile and this checkout, or keep the one already built from
the same inputs.

The inputs are the files the build copies (those git tracks or would track under the paths
the .dockerignore admits), the Dockerfile, the base (its image id: a base pulled or made
again is a new input) and the build arguments; their digest is a label on the image, so a
second build with nothing changed is a lookup.

pip inside the build reaches what pip reaches on this host: its index URLs, wheel folders
and CA bundle (``pip config list``) are passed as build arguments of the build stages, and
local folders (a wheel folder, a ``file://`` index) are bind-mounted into its RUN steps
read-only, so none of them lands in the image. docker cannot mount into a build: with docker
only the http(s) indexes are passed."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

import reposerve
from tools.image.engine import Engine, EngineError

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
# what the Dockerfile copies; .dockerignore admits the same paths
CONTEXT_PATHS = ("pyproject.toml", "README.md", "reposerve", "model_repository",
                 "tools/export_examples.py")  # fmt: skip
INPUTS_LABEL = "org.reposerve.inputs"
# what the bundled examples need: onnxruntime, torch (to export them), NVML for GPU gauges
DEFAULT_EXTRAS = "onnx,torch,gpu"
DEFAULT_TAG = f"localhost/reposerve:{reposerve.__version__}"
# where the host's CA bundle appears during RUN steps (a mount: never part of a layer)
BUILD_CA_PATH = "/run/reposerve-build-ca.crt"


@dataclass(frozen=True)
class PipSettings:
    """The package sources pip uses on this host."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    cert: str | None = None


@dataclass(frozen=True)
class BuildRequest:
    tag: str
    base: str
    extras: str = DEFAULT_EXTRAS
    pip: PipSettings = field(default_factory=PipSettings)


@dataclass(frozen=True)
class Built:
    tag: str
    inputs: str
    reused: bool
    seconds: float


def host_pip_settings(python: str = sys.executable) -> PipSettings:
    """pip's own view of its configuration (files and PIP_* variables; the variables win)."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    values: dict[str, str] = {}
    for line in listed.splitlines():
        scope_key, _, quoted = line.partition("=")
        scope, _, key = scope_key.rpartition(".")
        if key not in values or scope == ":env:":
            values[key] = quoted.strip("'\"")
    return PipSettings(
        index_url=values.get("index-url"),
        extra_index_urls=tuple(values.get("extra-index-url", "").split()),
        find_links=tuple(values.get("find-links", "").split()),
        cert=values.get("cert"),
    )


def request_for(
    tag: str, base: str, extras: str = DEFAULT_EXTRAS, extra_index_urls: Sequence[str] = ()
) -> BuildRequest:
    """A build of ``tag`` on ``base`` that reaches the host's package sources and
    ``extra_index_urls`` besides."""
    pip = host_pip_settings()
    pip = replace(pip, extra_index_urls=(*pip.extra_index_urls, *extra_index_urls))
    return BuildRequest(tag=tag, base=base, extras=extras, pip=pip)


def local_folder(location: str) -> Path | None:
    """The host folder behind a pip location, or None for a remote one."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path)
    return None


def build_arguments(request: BuildRequest, engine: Engine) -> tuple[dict[str, str], list[str]]:
    """The build arguments and the ``host:container:ro`` mounts that carry ``request``."""
    arguments = {"BASE": request.base, "EXTRAS": request.extras}
    mounts: list[str] = []

    def reachable(locations: Iterable[str], index: bool) -> list[str]:
        kept = []
        for location in locations:
            folder = local_folder(location)
            if folder is None:
                kept.append(location)
            elif engine.mounts_in_builds and folder.is_dir():
                # a simple index links to its files beside it: mount the index's root
                root = folder.parent if index and folder.name == "simple" else folder
                mounts.append(f"{root}:{root}:ro")
                kept.append(location)
        return kept

    pip = request.pip
    if pip.index_url is not None:
        arguments["PIP_INDEX_URL"] = " ".join(reachable([pip.index_url], index=True))
    arguments["PIP_EXTRA_INDEX_URL"] = " ".join(reachable(pip.extra_index_urls, index=True))
    arguments["PIP_FIND_LINKS"] = " ".join(reachable(pip.find_links, index=False))
    if pip.cert is not None and engine.mounts_in_builds and Path(pip.cert).is_file():
        mounts.append(f"{pip.cert}:{BUILD_CA_PATH}:ro")
        arguments["PIP_CERT"] = BUILD_CA_PATH
    return arguments, mounts


def context_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *CONTEXT_PATHS],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(path for path in listed.splitlines() if (REPO_ROOT / path).is_file())


def inputs_digest(arguments: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(arguments.items()):
        digest.update(f"{name}={value}\0".encode())
    for path in ["Dockerfile", ".dockerignore", *context_files()]:
        digest.update(path.encode() + b"\0" + (REPO_ROOT / path).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build(
    request: BuildRequest, engine: Engine, *, log: Path | None = None, timeout: float | None = None
) -> Built:
    """The image ``request.tag``, built unless one from the same inputs is there. The
    engine's output goes to ``log`` (else this process's); a failed build raises
    EngineError naming the log."""
    arguments, mounts = build_arguments(request, engine)
    base_id = engine.image_id(request.base)
    if base_id is None:
        raise EngineError(f"the base {request.base} is not in {engine.name}'s images")
    inputs = inputs_digest({**arguments, "base image id": base_id})
    started = time.monotonic()
    labels = engine.labels(request.tag)
    if labels is not None and labels.get(INPUTS_LABEL) == inputs:
        return Built(request.tag, inputs, reused=True, seconds=time.monotonic() - started)
    command = [*engine.build_command(), "--tag", request.tag, "--label", f"{INPUTS_LABEL}={inputs}"]
    for name, value in arguments.items():
        command += ["--build-arg", f"{name}={value}"]
    for mount in mounts:
        command += ["--volume", mount]
    command += ["--file", str(DOCKERFILE), str(REPO_ROOT)]
    with open(log, "wb") if log else open(sys.stdout.fileno(), "wb", closefd=False) as output:
        try:
            done = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, timeout=timeout, cwd=REPO_ROOT
            )
        except subprocess.TimeoutExpired as expired:
            raise EngineError(f"the build ran past {timeout} s (its output: {log})") from expired
    if done.returncode != 0:
        raise EngineError(f"the build failed with {done.returncode} (its output: {log or 'above'})")
    return Built(request.tag, inputs, reused=False, seconds=time.monotonic() - started)
