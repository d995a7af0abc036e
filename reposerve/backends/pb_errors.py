"""The exception a Triton python model raises, and sees raised by ``pb_utils`` calls."""

from __future__ import annotations


class TritonModelException(Exception):
    """Raise it from ``execute`` to fail every request of the call with its message."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""
