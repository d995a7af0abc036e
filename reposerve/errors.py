"""Typed errors shared by every layer.

Each layer raises its own subclass; each carries an ``ErrorKind`` that says what went
wrong in protocol-neutral words. Only ``reposerve.http`` turns a kind into a status code.
"""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"
    FORBIDDEN = "forbidden"
    UNSUPPORTED = "unsupported"  # a well-formed call this model cannot serve (Triton's)
    # Triton's other error codes, which its python backend's models may raise with
    # (pb_utils.TritonError); each reaches the client as Triton reports it.
    ALREADY_EXISTS = "already_exists"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


class ReposerveError(Exception):
    """Base of every error reposerve raises on purpose; the message is user-facing."""

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind

    @property
    def message(self) -> str:
        return str(self.args[0])


class ConfigError(ReposerveError):
    """A config.toml or repository layout problem: names the file, the key and the reason."""

    kind = ErrorKind.INVALID_ARGUMENT


class ProtocolError(ReposerveError):
    """A request that does not follow the V2 protocol or the model's signature."""

    kind = ErrorKind.INVALID_ARGUMENT


class RepositoryError(ReposerveError):
    """Unknown or not-ready models and versions; the kind says which."""

    kind = ErrorKind.NOT_FOUND


class SchedulerError(ReposerveError):
    """A request the scheduler refused or dropped: queue full, timeout, shutdown."""

    kind = ErrorKind.UNAVAILABLE


class SharedMemoryError(ReposerveError):
    """A client's shared-memory region that cannot be registered or used as asked: a bad
    key, a window past its file, a tensor that does not fit (``reposerve.shared_memory``)."""

    kind = ErrorKind.INVALID_ARGUMENT


class InstanceError(ReposerveError):
    """A batch that failed inside an instance: the model raised, or the process died."""

    kind = ErrorKind.INTERNAL


class InvalidInput(ReposerveError):
    """Raise this from a model's ``execute`` when a request's data is unusable (an image
    that does not decode, a value out of range): the request that holds it gets a 400 with
    your message, and the other requests of the batch still get their results.

    Any other exception from ``execute`` is a model failure: a 500 with its message.
    """

    kind = ErrorKind.INVALID_ARGUMENT


class ModelCallError(ReposerveError):
    """A model's call to another model (``context.infer``) failed: the message says which
    model and why, the kind how the front would have reported it. Uncaught, it fails the
    calling batch with that message."""


class ModelError(ReposerveError):
    """A model's execute failed, in words that say it all (a Triton python model's error,
    in Triton's form): the client gets them as they are, without reposerve's prefix."""


class TuneError(ReposerveError):
    """Why ``reposerve tune`` cannot go on: a server that does not answer, a model it
    cannot load, inputs it cannot read; the message says what to fix."""

    kind = ErrorKind.INVALID_ARGUMENT


class EmbeddedError(ReposerveError):
    """An embedded server (``reposerve.Server``) used as it cannot be: an option it
    cannot start with, a call before its start or after its stop, a start that failed."""

    kind = ErrorKind.INVALID_ARGUMENT


class RayServeError(ReposerveError):
    """The Ray Serve application (``reposerve.ray``) built with arguments it cannot take,
    or a replica whose models did not load; the message names the argument or model."""

    kind = ErrorKind.INVALID_ARGUMENT
