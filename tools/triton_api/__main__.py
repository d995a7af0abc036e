"""Run Triton's own tests of its in-process Python API, unchanged, against
``reposerve.tritonserver``: ``python/test/test_api.py`` of triton-inference-server/core,
with the models beside it, where ``import tritonserver`` is answered by an alias module
(``alias/tritonserver.py``). Prints each case's outcome, with the reason of each failure
and skip, and the totals; writes ``results.json`` and pytest's ``junit.xml``.

    python -m tools.triton_api --core-repo PATH [--out DIR] [-k EXPRESSION]

PATH is a checkout of triton-inference-server/core or its git directory (HEAD is read).
Cases that need a GPU (cupy, CUDA torch) skip themselves, as they do under Triton.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALIAS = Path(__file__).resolve().parent / "alias"
TESTS = "python/test"
_OUTCOMES = ("failure", "error", "skipped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.triton_api", description=__doc__)
    parser.add_argument(
        "--core-repo",
        type=Path,
        required=True,
        help="triton-inference-server/core checkout or git dir",
    )
    parser.add_argument("--out", type=Path, help="work folder (default /tmp/triton_api-TIME)")
    parser.add_argument("-k", dest="keyword", help="run only the cases pytest's -k selects")
    parser.add_argument(
        "--timeout", type=float, default=3600, help="cap the run at this many seconds"
    )
    args = parser.parse_args(argv)
    out = args.out or Path(f"/tmp/triton_api-{time.strftime('%Y%m%d-%H%M%S')}")
    tests = extract(args.core_repo, out)
    started = time.monotonic()
    run(tests, out / "junit.xml", args.keyword, args.timeout)
    cases = outcomes(out / "junit.xml")
    for case in cases:
        reason = f": {case['reason']}" if case["reason"] else ""
        print(f"{case['outcome'].upper():7} {case['name']}{reason}")
    totals = {
        kind: sum(c["outcome"] == kind for c in cases) for kind in ("passed", "failed", "skipped")
    }
    print(", ".join(f"{count} {kind}" for kind, count in totals.items()))
    result = {"seconds": round(time.monotonic() - started), "totals": totals, "cases": cases}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"results: {out / 'results.json'}", file=sys.stderr)
    return 1 if totals["failed"] or not cases else 0


def extract(core: Path, out: Path) -> Path:
    """Triton's API tests and their models, copied into ``out`` from a checkout or read
    from a git directory's HEAD; their folder."""
    shutil.rmtree(out / TESTS, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    if (core / TESTS / "test_api.py").is_file():
        shutil.copytree(core / TESTS, out / TESTS)
    else:
        archive = subprocess.run(
            ["git", f"--git-dir={core}", "archive", "--format=tar", "HEAD", TESTS],
            check=True,
            capture_output=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(out, filter="data")
    return out / TESTS


def run(tests: Path, junit: Path, keyword: str | None, timeout: float) -> None:
    """pytest over ``test_api.py`` in its own folder (no ini file of ours applies), with
    the alias first on the path and the asyncio plugin."""
    command = [sys.executable, "-m", "pytest", "-p", "tools.triton_api.plugin"]
    command += ["-p", "no:cacheprovider", "-q", f"--junitxml={junit}", "--rootdir", str(tests)]
    command += ["-k", keyword] if keyword else []
    path = [str(ALIAS), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    subprocess.run([*command, "test_api.py"], cwd=tests, env=env, timeout=timeout, check=False)


def outcomes(junit: Path) -> list[dict[str, str]]:
    """Each case of pytest's junit report: its name, outcome, and reason (the first line
    of a failure's or a skip's message)."""
    if not junit.is_file():
        return []
    cases = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for kind in _OUTCOMES:
            found = case.find(kind)
            if found is not None:
                outcome = "skipped" if kind == "skipped" else "failed"
                message = (found.get("message") or "").strip()
                reason = message.splitlines()[0] if message else ""
                break
        name = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        cases.append({"name": name, "outcome": outcome, "reason": reason})
    return cases


if __name__ == "__main__":
    sys.exit(main())
