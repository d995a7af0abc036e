"""What a suite is, as data: the steps of a Triton test.sh, one server start each.

A suite module builds these from its reading of Triton's test.sh; the runner executes them.
Nothing here runs anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .server import Live
    from .shell import Dir


@dataclass(frozen=True)
class Pytest:
    """`python3 -m pytest TARGET` as test.sh runs it; one case per test it reports.

    `skip` deselects tests that cannot run here (test id `Class::test` -> reason).
    `as_in_test_sh` records how test.sh runs the file when that is not pytest (a unittest
    file run as `python3 file.py` or `python3 -m unittest ...`): pytest runs the same
    TestCase classes and reports each test, which a bare exit code would not.
    """

    target: str
    label: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    skip: Mapping[str, str] = field(default_factory=dict)
    as_in_test_sh: str = ""
    timeout: float = 900
    # "unittest": run as test.sh does (`python3 -m unittest -v`), for files whose
    # TestResultCollector needs unittest's own result object (pytest's has no testsRun).
    runner: Literal["pytest", "unittest"] = "pytest"


@dataclass(frozen=True)
class Script:
    """`python3 ARGV > log` with test.sh's checks: exit status 0 and, if `grep`, that text."""

    argv: tuple[str, ...]
    case: str
    grep: str | None = "PASS"
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 600


@dataclass(frozen=True)
class Hook:
    """A step of test.sh between clients (curl, kill -9 of the stub, sleep).

    `fn` returns None when its check holds, else the failure text; with `case` None it is
    an action only, and what it returns is ignored.
    """

    fn: Callable[[Live], str | None]
    case: str | None = None


@dataclass(frozen=True)
class LogCheck:
    """`grep -c PATTERN $SERVER_LOG` compared as test.sh does, after the server stopped."""

    case: str
    pattern: str
    count: str = ">=1"  # ">=N", "==N"


Client = Pytest | Script | Hook


@dataclass(frozen=True)
class Step:
    """One `run_server` of test.sh: set up the repository, start, run clients, stop.

    `cwd` is the folder test.sh runs in, relative to the extracted tree (`qa/...`).
    `args` are Triton's server arguments as test.sh writes them; `{MODELDIR}` is
    qa/L0_backend_python and `{PWD}` the step's folder. The runner maps them to reposerve's.
    `expect`: "ready" (run_server), "fail" (run_server must not get ready), "exit"
    (run_server_nowait; wait $SERVER_PID: the server must exit on its own).
    `start_case` makes the start itself a case (when test.sh checks it).
    """

    name: str
    cwd: str
    args: tuple[str, ...]
    log: str
    setup: Callable[[Dir], None] | None = None
    clients: tuple[Client, ...] = ()
    log_checks: tuple[LogCheck, ...] = ()
    expect: Literal["ready", "fail", "exit"] = "ready"
    start_case: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""


@dataclass(frozen=True)
class Suite:
    """A Triton test.sh: its steps in order, and the cases it has that cannot run here."""

    name: str
    steps: tuple[Step, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    notes: str = ""
