"""Who may call which API: Triton's --http-restricted-api, and loopback-only control.

With no restriction on a control API (``model-repository``: load, unload, index;
``logging``: the log settings), its endpoints answer only clients on this machine, so a
server bound to 0.0.0.0 cannot be reconfigured from the network by default.
"""

from __future__ import annotations

import ipaddress

from starlette.requests import Request

from reposerve.errors import ErrorKind, ReposerveError
from reposerve.settings import RestrictedApi

# Triton's restricted-API categories that reposerve serves.
API_CATEGORIES = frozenset(
    {
        "health",
        "metadata",
        "inference",
        "model-config",
        "model-repository",
        "statistics",
        "logging",
    }
)
CONTROL_APIS = frozenset({"model-repository", "logging"})


class AccessError(ReposerveError):
    kind = ErrorKind.FORBIDDEN


class AccessPolicy:
    def __init__(self, restricted: list[RestrictedApi]) -> None:
        self._rules = {api: rule for rule in restricted for api in rule.apis}

    def guards(self, api: str) -> bool:
        """Whether calls to ``api`` need checking at all (lets the hot path skip it)."""
        return api in self._rules or api in CONTROL_APIS

    def check(self, api: str, request: Request) -> None:
        rule = self._rules.get(api)
        if rule is not None:
            if request.headers.get(rule.header) != rule.value:
                raise AccessError(f"This API is restricted, expecting header '{rule.header}'")
            return
        if api in CONTROL_APIS and not _is_loopback(request):
            raise AccessError(
                f"the {api} API answers only local clients; start the server "
                f"with --http-restricted-api {api}:HEADER=VALUE to allow others"
            )


def _is_loopback(request: Request) -> bool:
    if request.client is None:
        return False
    try:
        return ipaddress.ip_address(request.client.host).is_loopback
    except ValueError:
        return False
