"""How the repository refuses a request for a model it cannot serve: Triton's words
("Request for unknown model: ..."), which its clients and tests compare, then ours."""

from __future__ import annotations

from reposerve.errors import ErrorKind, RepositoryError
from reposerve.repository.version import ModelState

UNKNOWN = "Request for unknown model:"


def unknown_model(name: str) -> str:
    return f"{UNKNOWN} '{name}' is not found"


def not_ready(subject: str, state: ModelState, reason: str) -> RepositoryError:
    """Triton's text, then our state and reason. LOADING and UNLOADING pass by themselves
    (retry later); UNAVAILABLE does not: the model is not loaded, as if unknown, until
    someone loads it again."""
    detail = f": {reason}" if reason else ""
    kind = ErrorKind.NOT_FOUND if state is ModelState.UNAVAILABLE else ErrorKind.UNAVAILABLE
    return RepositoryError(f"{UNKNOWN} {subject} ({state.value}){detail}", kind=kind)
