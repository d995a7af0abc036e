"""Run Triton's client examples, unchanged, against reposerve.

Takes the python examples of a checkout of triton-inference-server/client (a git dir, as
the ``fetch`` tool gives it) for the features reposerve serves (sequences, system shared
memory), serves the models they ask for (written in ``tests/``: nothing is copied from
Triton), and runs each example as a user would, with ``-u`` pointing at reposerve. An
example passes when it exits 0 (they check their own results and exit 1 otherwise).

    python -m tools.triton_client_examples --client-repo PATH [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.sequence_models import (
    write_simple_dyna_sequence,
    write_simple_sequence,
    write_simple_string_dyna_sequence,
)
from tests.server import REPO_ROOT, start_server
from tests.toy_models import SIMPLE_STRING, SIMPLE_STRING_CONFIG, write_model

EXAMPLES = "src/python/examples"
# (script, protocol, extra arguments): every sequence example with and without -d (the
# dynamic-sequence models), and every system shared-memory one.
CASES = [
    *(
        (f"simple_{protocol}_sequence_{kind}_client.py", protocol, dyna)
        for protocol, kind in (
            ("http", "sync_infer"),
            ("grpc", "sync_infer"),
            ("grpc", "stream_infer"),
            ("grpc_aio", "stream_infer"),
        )
        for dyna in ([], ["-d"])
    ),
    *(
        (f"simple_{protocol}_shm{kind}_client.py", protocol, [])
        for protocol in ("http", "grpc")
        for kind in ("", "_string")
    ),
]


def _repository(root: Path) -> Path:
    repository = root / "repository"
    repository.mkdir(parents=True)
    for write in (
        write_simple_sequence,
        write_simple_dyna_sequence,
        write_simple_string_dyna_sequence,
    ):
        write(repository)
    # Triton's `simple` is our add_sub; its `simple_string` the same on numbers as strings
    shutil.copytree(REPO_ROOT / "model_repository" / "add_sub", repository / "simple")
    write_model(repository, "simple_string", SIMPLE_STRING_CONFIG, SIMPLE_STRING)
    return repository


def _extract(client_repo: Path, out: Path) -> Path:
    folder = out / "examples"
    folder.mkdir(parents=True)
    for script, _, _ in CASES:
        text = subprocess.run(
            ["git", "-C", str(client_repo), "show", f"HEAD:{EXAMPLES}/{script}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        (folder / script).write_text(text)
    return folder


def _environment() -> dict[str, str]:
    """tritonclient 2.51's shared-memory module finds its library with pkg_resources,
    which newer setuptools lacks: a sitecustomize puts the tests' stand-in in place first,
    so the examples' own imports work unchanged."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT / "tools" / "client_site"), str(REPO_ROOT), env.get("PYTHONPATH", "")]
    )
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.triton_client_examples")
    parser.add_argument("--client-repo", type=Path, required=True, help="client repo git dir")
    parser.add_argument("--out", type=Path, help="default /tmp/triton_client_examples-TIME")
    args = parser.parse_args(argv)
    out = args.out or Path(f"/tmp/triton_client_examples-{time.strftime('%Y%m%d-%H%M%S')}")
    examples = _extract(args.client_repo, out)
    server = start_server(_repository(out), out, "--allow-client-shm", "true")
    results = []
    try:
        for script, protocol, extra in CASES:
            url = server.address if protocol == "http" else server.grpc_address
            started = time.monotonic()
            run = subprocess.run(
                [sys.executable, str(examples / script), "-u", url, *extra],
                capture_output=True, text=True, timeout=300, env=_environment(), cwd=out,
            )  # fmt: skip
            name = " ".join([script, *extra])
            passed = run.returncode == 0
            output = (run.stdout + run.stderr).strip().splitlines()
            results.append(
                {
                    "example": name,
                    "passed": passed,
                    "seconds": round(time.monotonic() - started, 2),
                    "last_lines": output[-5:],
                }
            )
            print(f"{'PASS' if passed else 'FAIL'} {name}" + ("" if passed else f": {output[-3:]}"))
    finally:
        code = server.stop()
    passed = sum(result["passed"] for result in results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed; server exit {code}; log {server.log_path}")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return 0 if passed == len(results) and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
