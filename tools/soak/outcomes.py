"""What the soak counts: every request sent, every answer, and which answers fail it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable

import httpx

# Errors a fault explains, and the fault: an instance killed or restarting, a version
# reloaded or unloaded under the request, or the request's instance killed for a hung one.
EXPLAINED = (
    "was killed by SIGKILL",
    "retry shortly",
    "is unloading",
    "was unloaded before this request finished",
    " (UNLOADING)",  # the version, or the model with no other: Triton's not-ready words
    " (UNAVAILABLE): unloaded",
    "ran past execution.timeout_seconds",
    "the instance running this sequence stopped",
)


def explained(error: str) -> str:
    """The fault that explains ``error``, or "" when none does."""
    return next((reason for reason in EXPLAINED if reason in error), "")


TIMED_OUT = "did not finish within 1 s (execution.timeout_seconds)"
# Below the server's keep-alive (uvicorn's 5 s): a client that reused a connection idle
# that long could send just as the server closes it, a ReadError that is nobody's fault
# (seen on a machine loaded six times over, where a client's own loop lags seconds).
KEEPALIVE_EXPIRY_S = 2.0


def http_client(base: str, timeout: float = 60) -> httpx.AsyncClient:
    """A soak client's HTTP connection pool on ``base``."""
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)
    return httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits)


class Outcomes:
    """What happened: ``seen`` counts every outcome, ``problems`` only those that fail the soak."""

    def __init__(self) -> None:
        self.seen: Counter = Counter()
        self.problems: Counter = Counter()
        self.sent = 0
        self.answered = 0

    def ok(self, outcome: str) -> None:
        self.seen[outcome] += 1

    def problem(self, outcome: str) -> None:
        self.seen[outcome] += 1
        self.problems[outcome] += 1

    async def answer(self, reply: Awaitable[httpx.Response], what: str) -> httpx.Response | None:
        """``reply`` awaited and counted: sent, and answered, or lost (a problem: None)."""
        self.sent += 1
        try:
            response = await reply
        except httpx.HTTPError as exc:
            self.problem(f"LOST: {what} got no answer ({type(exc).__name__})")
            return None
        self.answered += 1
        return response

    def failed(self, what: str, reply: httpx.Response) -> None:
        """``reply`` is not what ``what`` should get: a fault explains it, or it is a problem."""
        if reason := explained(reply.text):
            self.ok(f"{what} failed by a fault: {reason}")
        else:
            self.problem(f"{what} answered {reply.status_code} {reply.text[:120]}")
