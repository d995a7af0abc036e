"""Who may call which API, for every front: Triton's --http-restricted-api and
--grpc-restricted-protocol, and loopback-only control.

With no restriction on a control API (``model-repository``: load, unload, index;
``logging``: the log settings; ``shared-memory``: registering, unregistering and listing
client shared-memory regions), its calls are answered only for clients on this machine,
so a server bound to 0.0.0.0 cannot be reconfigured from the network by default. The
fronts adapt their requests to ``check_call`` (a header lookup and the client's address).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

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
        "shared-memory",
    }
)
CONTROL_APIS = frozenset({"model-repository", "logging", "shared-memory"})


class AccessError(ReposerveError):
    kind = ErrorKind.FORBIDDEN


class RestrictedError(AccessError):
    """A restricted API called without its header (gRPC answers it apart, as Triton does)."""


class Policy:
    def __init__(self, restricted: list[RestrictedApi], noun: str = "API") -> None:
        """``noun``: what the refusal calls the call (Triton: "API" on HTTP, "protocol"
        on gRPC)."""
        self._rules = {api: rule for rule in restricted for api in rule.apis}
        self._noun = noun

    def guards(self, api: str) -> bool:
        """Whether calls to ``api`` need checking at all (lets the hot path skip it)."""
        return api in self._rules or api in CONTROL_APIS

    def check_call(
        self, api: str, header: Callable[[str], str | bytes | None], host: str | None, flag: str
    ) -> None:
        """``header`` looks up a (lower-case) request header or gRPC metadata key (bytes for
        a binary one), ``host`` is the client's address, ``flag`` the option that lifts the
        restriction."""
        rule = self._rules.get(api)
        if rule is not None:
            if header(rule.header) != rule.value:
                raise RestrictedError(
                    f"This {self._noun} is restricted, expecting header '{rule.header}'"
                )
            return
        if api in CONTROL_APIS and not _is_loopback(host):
            raise AccessError(
                f"the {api} API answers only local clients; start the server "
                f"with {flag} {api}:HEADER=VALUE to allow others"
            )


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
