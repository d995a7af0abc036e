"""The errors of a Triton python model: the exception it raises (and sees raised by
``pb_utils`` calls), and the error of one response."""

from __future__ import annotations


class TritonModelException(Exception):
    """Raise it from ``execute`` to fail every request of the call with its message."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class TritonError:
    """The error of one response: that request fails, the others of the batch do not.

    The code decides the status the client sees, as in Triton: INTERNAL (the default)
    500, NOT_FOUND 404, UNAVAILABLE 503, and the client's-fault codes 400.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"
