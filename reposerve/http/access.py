"""``reposerve.access``'s policy for HTTP requests (--http-restricted-api)."""

from __future__ import annotations

from starlette.requests import Request

from reposerve.access import API_CATEGORIES, CONTROL_APIS, AccessError, Policy

__all__ = ["API_CATEGORIES", "CONTROL_APIS", "AccessError", "AccessPolicy"]


class AccessPolicy(Policy):
    def check(self, api: str, request: Request) -> None:
        host = request.client.host if request.client is not None else None
        self.check_call(api, request.headers.get, host, "--http-restricted-api")
