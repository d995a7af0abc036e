"""Command-line value types both commands share (``reposerve`` and ``reposerve tune``):
each turns a string into its value or an argparse error that says what was expected."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import msgspec


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


def positive_int_at_most(limit: int, why: str) -> Callable[[str], int]:
    """An int from 1 to ``limit``; ``why`` says where the limit comes from, in the error."""

    def parse(value: str) -> int:
        number = positive_int(value)
        if number > limit:
            raise argparse.ArgumentTypeError(f"expected at most {limit} ({why}), got {value!r}")
        return number

    parse.__name__ = "int"
    return parse


class Budget(msgspec.Struct, frozen=True):
    """A budget as given: bytes, or a share of the machine's (or a GPU's) total."""

    text: str
    nbytes: int | None = None  # fixed bytes
    share: float | None = None  # of the total, 0 < share <= 1

    def of(self, total: int) -> int:
        return self.nbytes if self.nbytes is not None else int(total * (self.share or 0))


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_budget(text: str) -> Budget:
    """``"1500000000"``, ``"1.5G"`` (K, M, G, T: powers of 1024, an optional ``iB``/``B``)
    or ``"60%"``; ValueError says what is wrong."""
    value = text.strip().lower()
    if value.endswith("%"):
        share = float(value[:-1]) / 100
        if not 0 < share <= 1:
            raise ValueError(f"{text!r}: a share must be above 0% and at most 100%")
        return Budget(text, share=share)
    if value.endswith("ib") and value[-3:-2] in "kmgt":  # 512MiB
        value = value[:-2]
    elif value.endswith("b") and (value[-2:-1].isdigit() or value[-2:-1] in "kmgt"):  # 2GB, 100B
        value = value[:-1]
    unit = value[-1:] if value[-1:].isalpha() else ""
    if unit not in _UNITS:
        raise ValueError(f"{text!r}: not bytes (1500000000, 1.5G, 512M) or a share (60%)")
    number = float(value[: len(value) - len(unit)])
    nbytes = int(number * _UNITS[unit])
    if nbytes <= 0:
        raise ValueError(f"{text!r}: a budget must be above 0 bytes")
    return Budget(text, nbytes=nbytes)


def memory_budget(text: str) -> Budget:
    """``parse_budget`` as an argparse type."""
    try:
        return parse_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
