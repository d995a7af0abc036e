"""What tune shows while it runs: on a terminal, one line rewritten in place with the
candidate, its sweep and the time left; elsewhere (a log), one line per candidate."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from reposerve.tune.results import Settings, Trial


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(max(0, int(seconds)), 60)
    return f"{minutes}:{seconds:02d}"


class Progress:
    def __init__(self, started: float, budget: float, stream: TextIO = sys.stderr) -> None:
        self._started = started
        self._budget = budget
        self._stream = stream
        self._live = stream.isatty()
        self._count = 0

    def _prefix(self) -> str:
        elapsed = time.monotonic() - self._started
        return (
            f"[{self._count:>2} | {_clock(elapsed)}, at most {_clock(self._budget - elapsed)} left]"
        )

    def point(self, line: str) -> None:
        if self._live:
            self._stream.write(f"\r\033[K{self._prefix()} {line}")
            self._stream.flush()

    def trial(self, trial: Trial) -> None:
        result = f"{trial.score:.1f} requests/s at c={trial.concurrency}"
        if trial.status != "measured":
            result = f"{trial.status}: {trial.reason}"
        elif trial.reason:
            result += f" ({trial.reason})"
        self._line(f"{trial.label}: {result}")

    def note(self, text: str) -> None:
        self._line(text)

    def _line(self, text: str) -> None:
        start = "\r\033[K" if self._live else ""
        self._stream.write(f"{start}{self._prefix()} {text}\n")
        self._stream.flush()

    def timed(self, evaluate: Callable[[Settings, str], Trial]) -> Callable[[Settings, str], Trial]:
        """``evaluate``, counted and reported as each candidate ends."""

        def counted(settings: Settings, label: str) -> Trial:
            self._count += 1
            trial = evaluate(settings, label)
            self.trial(trial)
            return trial

        return counted
