"""Execute suites: per step set up, start, run clients, stop, grep the log; report cases."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import time
from pathlib import Path

from . import server
from .clients import Case, collect_pytest, first_error, run_pytest, run_script
from .shell import Dir
from .spec import Hook, LogCheck, Pytest, Script, Step, Suite

SHIMS = Path(__file__).parent / "shims"
READY_TIMEOUT = 120.0  # util.sh's SERVER_TIMEOUT
FAIL_TIMEOUT = 60.0  # how long a start that must fail may take to show it


def extract(server_repo: Path, into: Path) -> Path:
    """The parts of Triton's qa/ tree the suites use, as a work tree under `into`."""
    into.mkdir(parents=True, exist_ok=True)
    paths = ["qa/common", "qa/python_models", "qa/L0_backend_python", "qa/L0_http"]
    archive = subprocess.run(
        ["git", f"--git-dir={server_repo}", "archive", "HEAD", *paths],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


class Runner:
    def __init__(
        self, root: Path, backend_repo: Path | None, out: Path, timeout: float | None = None
    ) -> None:
        self.timeout = timeout  # caps every client's own limit (a hung test costs that long)
        self.root = root
        self.backend_repo = backend_repo
        self.out = out
        self.cases: list[Case] = []
        self.steps: list[dict] = []

    # -- environment -------------------------------------------------------------------
    def env(self, step: Step) -> dict[str, str]:
        """What test.sh exports: reaches both the server and its clients."""
        env = dict(os.environ)
        pythonpath = [str(SHIMS), str(self.root / "qa/common"), env.get("PYTHONPATH", "")]
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in pythonpath if p),
            TRITON_DIR=str(self.root),  # the qa tree sits under TRITON_DIR in Triton's image
            TRITONSERVER_IPADDR="localhost",
            TEST_WINDOWS="0",
            TEST_JETSON="0",
            PYTHONUNBUFFERED="1",
        )
        env.update(step.env)
        return env

    def record(self, suite: Suite, case: Case) -> None:
        case.id = f"{suite.name}::{case.id}"
        self.cases.append(case)
        line = f"{case.status} {case.id}"
        if case.reason:
            line += f" {case.reason}"
        print(line, flush=True)

    # -- one suite -----------------------------------------------------------------------
    def run(self, suite: Suite) -> None:
        print(f"# suite {suite.name}", flush=True)
        for case_id, reason in suite.skipped:
            self.record(suite, Case(case_id, "SKIP", reason))
        for step in suite.steps:
            try:
                self.run_step(suite, step)
            except Exception as e:  # a harness or setup error fails that step, not the run
                self.record(suite, Case(f"{step.name}::setup", "FAIL", f"{type(e).__name__}: {e}"))

    def run_step(self, suite: Suite, step: Step) -> None:
        cwd = (self.root / step.cwd).resolve()
        cwd.mkdir(parents=True, exist_ok=True)
        d = Dir(cwd, root=self.root, backend_repo=self.backend_repo)
        if step.setup:
            step.setup(d)
        values = {"MODELDIR": str(self.root / "qa/L0_backend_python"), "PWD": str(cwd)}
        triton_args = [_fill(a, values) for a in step.args]
        argv, dropped = server.map_args(triton_args)
        env = self.env(step)
        logs = self.out / "logs" / suite.name
        logs.mkdir(parents=True, exist_ok=True)
        record = {
            "suite": suite.name,
            "step": step.name,
            "cwd": step.cwd,
            "triton_args": triton_args,
            "reposerve_args": argv,
            "dropped_flags": dropped,
            "notes": step.notes,
        }
        self.steps.append(record)
        prefix = f"{step.name}::" if step.name else ""

        busy = server.ports_free()
        if busy:
            self.record(suite, Case(f"{prefix}server_start", "FAIL", busy))
            return
        log = cwd / step.log
        started = time.monotonic()
        live = server.start(argv, cwd, log, env)
        if step.expect == "ready":
            ok = server.wait_ready(live, READY_TIMEOUT)
            why = "" if ok else self._start_failure(live, "did not become ready")
        elif step.expect == "fail":
            ok = not server.wait_ready(live, FAIL_TIMEOUT)
            why = "" if ok else "started and became ready, but test.sh expects it to fail"
        else:
            ok = server.wait_exit(live, FAIL_TIMEOUT)
            why = (
                ""
                if ok
                else f"still running {FAIL_TIMEOUT:.0f}s after start; test.sh waits for it to exit"
            )
        record["start_seconds"] = round(time.monotonic() - started, 1)
        record["started_as_expected"] = ok
        if step.start_case:
            self.record(suite, Case(f"{prefix}{step.start_case}", "PASS" if ok else "FAIL", why))

        for index, client in enumerate(step.clients):
            tag = f"{step.name or 'main'}.{index}"
            for case in self.run_client(client, prefix, cwd, env, logs, tag, live, ok, why):
                self.record(suite, case)

        code = server.stop(live)
        record["exit_code"] = code
        record["server_notes"] = live.notes
        text = live.log_text()
        record["server_log_tail"] = text.splitlines()[-40:]
        (logs / f"{step.name or 'main'}.server.log").write_text(text)
        for check in step.log_checks:
            filled = LogCheck(check.case, _fill(check.pattern, values), check.count)
            self.record(suite, self.log_check(filled, prefix, text))

    def _start_failure(self, live: server.Live, what: str) -> str:
        """The first ERROR line of the log (the cause, usually), else its last error-ish line."""
        lines = [line.strip() for line in live.log_text().splitlines() if line.strip()]
        errors = [line for line in lines if re.search(r"\bERROR\b", line)]
        other = [
            line
            for line in lines
            if re.search(r"Error|Exception|fail", line.replace("uvicorn.error", ""))
        ]
        cause = (errors[:1] or other[-1:] or lines[-1:] or ["(empty log)"])[0]
        state = "exited" if not live.alive() else "running"
        return f"server {what} ({state}): {cause[:300]}"

    def run_client(self, client, prefix, cwd, env, logs, tag, live, ok, why) -> list[Case]:
        if not ok and not isinstance(client, Hook):
            reason = why or "the server did not start as test.sh expects"
            if isinstance(client, Pytest):
                ids = collect_pytest(client, cwd, {**env, **client.env})
                cases = [Case(f"{prefix}{client.label}{i}", "FAIL", reason) for i in ids]
                cases += [
                    Case(f"{prefix}{client.label}{t}", "SKIP", r) for t, r in client.skip.items()
                ]
                return cases or [Case(f"{prefix}{client.label}{client.target}", "FAIL", reason)]
            return [Case(f"{prefix}{client.case}", "FAIL", reason)]
        if self.timeout and isinstance(client, Pytest | Script):
            client = dataclasses.replace(client, timeout=min(client.timeout, self.timeout))
        if isinstance(client, Pytest):
            return run_pytest(client, prefix + client.label, cwd, env, logs, tag)
        if isinstance(client, Script):
            return [run_script(client, prefix, cwd, env, logs, tag)]
        try:
            result = client.fn(live)
        except Exception as e:
            result = f"{type(e).__name__}: {e}"
        if client.case is None:
            return []
        if result is None:
            return [Case(f"{prefix}{client.case}", "PASS")]
        head, text = first_error(result)
        return [Case(f"{prefix}{client.case}", "FAIL", head or result[:300], text)]

    @staticmethod
    def log_check(check: LogCheck, prefix: str, text: str) -> Case:
        count = sum(1 for line in text.splitlines() if check.pattern in line)
        op, n = check.count[:2], int(check.count[2:])
        ok = count >= n if op == ">=" else count == n
        reason = (
            ""
            if ok
            else f"grep -c {check.pattern!r} in the server log: {count}, want {check.count}"
        )
        return Case(f"{prefix}{check.case}", "PASS" if ok else "FAIL", reason)


def main_run(
    suites: list[Suite],
    server_repo: Path,
    backend_repo: Path | None,
    out: Path,
    timeout: float | None = None,
) -> Runner:
    root = extract(server_repo, out / "work")
    runner = Runner(root, backend_repo, out, timeout)
    for suite in suites:
        runner.run(suite)
    return runner
