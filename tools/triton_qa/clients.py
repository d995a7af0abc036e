"""Run a suite's clients as test.sh does, and turn what they report into cases."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from .spec import Pytest, Script


@dataclass
class Case:
    id: str
    status: str  # PASS | FAIL | SKIP
    reason: str = ""
    text: str = ""


def _run(argv: list[str], cwd: Path, env: dict[str, str], log: Path, timeout: float):
    """(exit status or None on timeout, output)"""
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    return rc, log.read_text(errors="replace")


def first_error(text: str, limit: int = 12) -> tuple[str, str]:
    """(one line saying what failed, the first lines of the assertion)."""
    lines = text.splitlines()
    errors = [line[4:].rstrip() if line.startswith("E   ") else line for line in lines]
    e_lines = [e for line, e in zip(lines, errors, strict=True) if line.startswith("E ")]
    picked = e_lines or [line for line in lines if line.strip()][-limit:]
    head = next(
        (line.strip() for line in picked if re.search(r"Error|Exception|assert|Fail", line)),
        picked[0].strip() if picked else "",
    )
    return head[:300], "\n".join(picked[:limit])


_VERBOSE = re.compile(r"^\S+?\.py::(\S+) (PASSED|FAILED|ERROR|SKIPPED)", re.M)


def _test_id(classname: str, name: str) -> str:
    cls = classname.rsplit(".", 1)[-1] if classname else ""
    return f"{cls}::{name}" if cls else name


_UNITTEST_LINE = re.compile(
    r"^(test\w*) \((?:[\w.]*\.)?(\w+)\.\w+\)\s*\.\.\. (ok|FAIL|ERROR|skipped[^\n]*)$", re.M
)
_UNITTEST_FAILURE = re.compile(
    r"^(?:FAIL|ERROR): (test\w*) \([\w.]*?(\w+)\.\w+\)\n-+\n(.*?)(?=^=+$|^-+\nRan |\Z)",
    re.M | re.S,
)


def run_unittest(
    client: Pytest, prefix: str, cwd: Path, env: dict[str, str], logs: Path, tag: str
) -> list[Case]:
    """`python3 -m unittest -v MODULE`: one case per test line unittest prints."""
    log = logs / f"{tag}.client.log"
    module = Path(client.target.split("::", 1)[0]).stem
    argv = [sys.executable, "-m", "unittest", "-v", module]
    rc, output = _run(argv, cwd, {**env, **client.env}, log, client.timeout)
    details = {
        f"{cls}::{name}": text.strip() for name, cls, text in _UNITTEST_FAILURE.findall(output)
    }
    cases = []
    for name, cls, verdict in _UNITTEST_LINE.findall(output):
        test_id = f"{cls}::{name}"
        if verdict == "ok":
            cases.append(Case(prefix + test_id, "PASS"))
        elif verdict.startswith("skipped"):
            cases.append(Case(prefix + test_id, "SKIP", "skipped by the test: " + verdict))
        else:
            text = details.get(test_id, "")
            head = text.splitlines()[-1][:300] if text else verdict
            cases.append(Case(prefix + test_id, "FAIL", head, text))
    if rc is None:
        cases.append(Case(f"{prefix}{module}", "FAIL", "timed out", output[-2000:]))
    elif not cases:
        head, text = first_error(output)
        cases.append(Case(f"{prefix}{module}", "FAIL", f"unittest exited {rc}: {head}", text))
    return cases


def run_pytest(
    client: Pytest, prefix: str, cwd: Path, env: dict[str, str], logs: Path, tag: str
) -> list[Case]:
    if client.runner == "unittest":
        return run_unittest(client, prefix, cwd, env, logs, tag)
    xml = logs / f"{tag}.report.xml"
    log = logs / f"{tag}.client.log"
    xml.unlink(missing_ok=True)
    target_file = client.target.split("::", 1)[0]
    module = Path(target_file).stem
    deselect = []
    for test in client.skip:
        deselect += ["--deselect", f"{target_file}::{test}"]
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rN"]
    argv += [f"--junitxml={xml}", client.target, *deselect]
    rc, output = _run(argv, cwd, {**env, **client.env}, log, client.timeout)
    cases = [Case(f"{prefix}{test}", "SKIP", reason) for test, reason in client.skip.items()]
    if not xml.exists():
        # Killed (timeout): keep what -v printed for the tests that finished.
        for test, verdict in _VERBOSE.findall(output):
            status = {"PASSED": "PASS", "SKIPPED": "SKIP"}.get(verdict, "FAIL")
            reason = "" if status == "PASS" else f"{verdict} (details lost: pytest was killed)"
            cases.append(Case(f"{prefix}{test}", status, reason))
        head, text = first_error(output)
        why = f"timed out after {client.timeout:.0f}s" if rc is None else f"pytest exited {rc}"
        return [*cases, Case(f"{prefix}{module}", "FAIL", f"{why} without a report: {head}", text)]
    for tc in ET.parse(xml).getroot().iter("testcase"):
        test_id = prefix + _test_id(tc.get("classname", ""), tc.get("name", ""))
        failed = tc.find("failure")
        if failed is None:
            failed = tc.find("error")
        skipped = tc.find("skipped")
        if failed is not None:
            head, text = first_error((failed.text or "") or failed.get("message", ""))
            message = failed.get("message", "") or head
            cases.append(
                Case(test_id, "FAIL", message.splitlines()[0][:300] if message else head, text)
            )
        elif skipped is not None:
            cases.append(
                Case(test_id, "SKIP", "skipped by the test: " + skipped.get("message", ""))
            )
        else:
            cases.append(Case(test_id, "PASS"))
    if rc is None:
        cases.append(Case(f"{prefix}{module}", "FAIL", "timed out", output[-2000:]))
    return cases


def collect_pytest(client: Pytest, cwd: Path, env: dict[str, str]) -> list[str]:
    """The test ids a pytest client would run (to fail them when the server did not start)."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only"]
    proc = subprocess.run(
        [*argv, client.target], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    ids = []
    for line in proc.stdout.splitlines():
        if "::" in line and not line.startswith(" "):
            parts = line.split("::")
            if parts[0].endswith(".py"):
                ids.append("::".join(parts[1:]))
    return [i for i in ids if i not in client.skip]


def run_script(
    client: Script, prefix: str, cwd: Path, env: dict[str, str], logs: Path, tag: str
) -> Case:
    log = logs / f"{tag}.client.log"
    rc, output = _run(
        [sys.executable, *client.argv], cwd, {**env, **client.env}, log, client.timeout
    )
    case_id = prefix + client.case
    if rc is None:
        return Case(case_id, "FAIL", f"timed out after {client.timeout:.0f}s", output[-2000:])
    if rc != 0:
        head, text = first_error(output)
        return Case(case_id, "FAIL", f"exit {rc}: {head}", text)
    if client.grep and client.grep not in output:
        head, text = first_error(output)
        return Case(case_id, "FAIL", f"no {client.grep!r} in the output: {head}", text)
    return Case(case_id, "PASS")
