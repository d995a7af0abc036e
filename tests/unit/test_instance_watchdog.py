"""The execution timeout of an instance's batches: the rule (``overdue``) at given times,
and the one timer that keeps it (``Watchdog``) on a fake clock, without sleeping."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reposerve.instance.books import Books
from reposerve.instance.outcomes import SlotHold
from reposerve.instance.watchdog import Overran, Sleep, Watchdog, overdue

pytestmark = pytest.mark.unit


class FakeTimer:
    def __init__(self, due: float, callback: Callable[[], None]) -> None:
        self.due = due
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """Loop time in seconds, moved by hand; timers run when it passes them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def advance_to(self, now: float) -> None:
        self.now = now
        while due := [t for t in self.timers if t.due <= now and not t.cancelled]:
            timer = min(due, key=lambda t: t.due)
            self.timers.remove(timer)
            timer.callback()

    @property
    def pending(self) -> list[float]:
        return [timer.due for timer in self.timers if not timer.cancelled]


def _send(books: Books, now: float) -> int:
    return books.add(0, SlotHold(lambda: None), lambda event: None, now)


def test_nothing_running_is_never_overdue():
    assert overdue(Books(), now=100.0, limit=5.0) is None


def test_a_batch_is_overdue_once_it_has_run_the_whole_limit():
    books = Books()
    batch_id = _send(books, now=10.0)
    assert overdue(books, now=13.0, limit=5.0) == Sleep(2.0)
    assert overdue(books, now=15.0, limit=5.0) == Overran(batch_id)
    assert overdue(books, now=99.0, limit=5.0) == Overran(batch_id)


def test_the_batch_running_longest_decides():
    books = Books(max_inflight=3)
    _send(books, now=2.0)
    oldest = _send(books, now=1.0)
    _send(books, now=3.0)
    assert overdue(books, now=4.0, limit=5.0) == Sleep(2.0)
    assert overdue(books, now=6.0, limit=5.0) == Overran(oldest)


def test_a_staged_batch_is_timed_from_when_it_begins():
    books = Books(staging=1)
    first = _send(books, now=0.0)
    second = _send(books, now=1.0)
    books.answered(first, now=4.0)
    assert overdue(books, now=6.0, limit=5.0) == Sleep(3.0)
    assert overdue(books, now=9.0, limit=5.0) == Overran(second)


def test_a_stream_paused_for_its_clients_has_no_deadline():
    books = Books(max_inflight=2)
    waiting = _send(books, now=0.0)
    running = _send(books, now=3.0)
    books.get(waiting).paused = True  # type: ignore[union-attr]
    assert overdue(books, now=6.0, limit=5.0) == Sleep(2.0)
    assert overdue(books, now=8.0, limit=5.0) == Overran(running)
    books.get(running).paused = True  # type: ignore[union-attr]
    assert overdue(books, now=100.0, limit=5.0) is None


def test_the_watchdog_reports_a_batch_that_hangs():
    loop, books, overran = FakeLoop(), Books(), []
    watchdog = Watchdog(5.0, books, loop, overran.append)
    batch_id = _send(books, now=0.0)
    watchdog.arm()
    watchdog.arm()  # one timer per instance, however many batches arm it
    assert loop.pending == [5.0]
    loop.advance_to(4.9)
    assert overran == []
    loop.advance_to(5.0)
    assert overran == [batch_id] and loop.pending == []


def test_the_watchdog_sleeps_until_the_next_batch_is_due():
    loop, books, overran = FakeLoop(), Books(staging=1), []
    watchdog = Watchdog(5.0, books, loop, overran.append)
    first = _send(books, now=0.0)
    watchdog.arm()
    loop.advance_to(3.0)
    second = _send(books, now=3.0)
    watchdog.arm()
    books.answered(first, now=3.0)  # the second begins at 3: due at 8, not at 5
    loop.advance_to(5.0)
    assert overran == [] and loop.pending == [8.0]
    loop.advance_to(8.0)
    assert overran == [second]


def test_the_watchdog_goes_quiet_once_every_batch_is_answered():
    loop, books, overran = FakeLoop(), Books(), []
    watchdog = Watchdog(5.0, books, loop, overran.append)
    batch_id = _send(books, now=0.0)
    watchdog.arm()
    books.answered(batch_id, now=1.0)
    loop.advance_to(50.0)
    assert overran == [] and loop.pending == []


def test_a_resumed_stream_is_timed_again_from_its_resume():
    loop, books, overran = FakeLoop(), Books(), []
    watchdog = Watchdog(5.0, books, loop, overran.append)
    batch_id = _send(books, now=0.0)
    watchdog.arm()
    batch = books.get(batch_id)
    assert batch is not None
    batch.paused = True  # its client reads slowly
    loop.advance_to(20.0)
    assert overran == [] and loop.pending == []  # nothing to time: no timer
    books.resume(batch_id, now=20.0)
    watchdog.arm()
    loop.advance_to(24.0)
    assert overran == []
    loop.advance_to(25.0)
    assert overran == [batch_id]


def test_no_timeout_arms_nothing_and_stop_cancels_the_timer():
    loop, books, overran = FakeLoop(), Books(), []
    _send(books, now=0.0)
    Watchdog(0, books, loop, overran.append).arm()
    assert loop.pending == []
    watchdog = Watchdog(5.0, books, loop, overran.append)
    watchdog.arm()
    watchdog.stop()
    loop.advance_to(50.0)
    assert overran == [] and loop.pending == []
