"""Command-line value types both commands share (``reposerve`` and ``reposerve tune``):
each turns a string into its value or an argparse error that says what was expected."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def boolean(value: str) -> bool:
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def non_negative(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError:
            number = -1
        if not number >= 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__} >= 0, got {value!r}")
        return number

    parse.__name__ = kind.__name__  # what argparse names in its messages
    return parse


def positive(what: str) -> Callable[[str], float]:
    """A number > 0, ``what`` naming it in the error (``milliseconds``, ``seconds``)."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = 0.0
        if not number > 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"expected {what} > 0, got {value!r}")
        return number

    parse.__name__ = what
    return parse


def positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value!r}")
    return int(value)
