"""Triton's error classes (``tritonserver.TritonError`` and its kinds), and the one place a
reposerve error becomes one of them: its ``ErrorKind`` picks the class, its message stays.
Code that catches Triton's classes catches ours under the same names."""

from __future__ import annotations

from reposerve.errors import ErrorKind, ReposerveError


class TritonError(Exception):
    """Base of every error this API raises on purpose."""


class UnknownError(TritonError):
    pass


class InternalError(TritonError):
    pass


class NotFoundError(TritonError):
    pass


class InvalidArgumentError(TritonError):
    pass


class UnavailableError(TritonError):
    pass


class UnsupportedError(TritonError):
    pass


class AlreadyExistsError(TritonError):
    pass


# Triton's codes have no forbidden or cancelled class: those fall back to UnknownError,
# as Triton's own binding does for a code it has no class for.
_BY_KIND: dict[ErrorKind, type[TritonError]] = {
    ErrorKind.INVALID_ARGUMENT: InvalidArgumentError,
    ErrorKind.NOT_FOUND: NotFoundError,
    ErrorKind.UNAVAILABLE: UnavailableError,
    ErrorKind.INTERNAL: InternalError,
    ErrorKind.UNSUPPORTED: UnsupportedError,
    ErrorKind.ALREADY_EXISTS: AlreadyExistsError,
}


def triton_error(error: Exception) -> TritonError:
    """``error`` as Triton's class for its kind (an unexpected one is internal)."""
    if isinstance(error, TritonError):
        return error
    if isinstance(error, ReposerveError):
        return _BY_KIND.get(error.kind, UnknownError)(error.message)
    return InternalError(f"{type(error).__name__}: {error}")
