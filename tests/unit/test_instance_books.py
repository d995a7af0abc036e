"""The front's books on an instance's batches: what runs, what waits staged, the room model
calls make, paused and cancelled streams, and which batches fail (and how) when the
process is gone. Time is plain numbers (loop seconds), no process, no loop."""

from __future__ import annotations

from functools import partial

import pytest

from reposerve.instance.books import NESTED_LIMIT, Books
from reposerve.instance.outcomes import (
    BatchEvent,
    BatchFailure,
    BatchOutcome,
    BatchStarted,
    FailureCause,
    SlotHold,
)

pytestmark = pytest.mark.unit


class Owner:
    """What the books tell a batch's owner: when it starts, how it ends."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.done: dict[str, BatchOutcome | BatchFailure] = {}

    def send(self, books: Books, name: str, now: float = 0.0) -> int:
        return books.add(
            slot=0, hold=SlotHold(lambda: None), on_event=partial(self.receive, name), now=now
        )

    def receive(self, name: str, event: BatchEvent) -> None:
        if isinstance(event, BatchStarted):
            self.started.append(name)
        else:
            self.done[name] = event


def test_a_sync_instance_runs_one_batch_and_stages_the_next():
    books, owner = Books(staging=1), Owner()
    assert (books.limit(), books.limit(staged=True)) == (1, 2)
    first = owner.send(books, "a", now=1.0)
    second = owner.send(books, "b", now=2.0)
    assert (first, second) == (0, 1)
    assert owner.started == ["a"] and len(books) == 2
    staged = books.get(second)
    assert staged is not None and not staged.started
    # Answered at 5: the staged batch begins then, its timeout counted from then.
    assert books.answered(first, now=5.0) is not None
    assert owner.started == ["a", "b"] and staged.started and staged.since == 5.0
    assert len(books) == 1


def test_staged_batches_begin_in_the_order_they_were_sent():
    books, owner = Books(staging=3), Owner()
    ids = [owner.send(books, name) for name in "abcd"]
    for batch_id in ids[:3]:
        books.answered(batch_id, now=1.0)
    assert owner.started == ["a", "b", "c", "d"]


def test_an_async_instance_runs_as_many_as_it_says_at_once():
    books, owner = Books(max_inflight=3), Owner()
    for name in "abcd":
        owner.send(books, name)
    assert owner.started == ["a", "b", "c"]
    assert books.limit() == books.limit(staged=True) == 3


def test_an_answer_that_ends_the_process_starts_nothing_behind_it():
    books, owner = Books(staging=1), Owner()
    first = owner.send(books, "a")
    owner.send(books, "b")
    assert books.answered(first, now=1.0, next_starts=False) is not None
    assert owner.started == ["a"]


def test_an_answer_to_a_batch_no_longer_held_is_ignored():
    books, owner = Books(staging=1), Owner()
    first = owner.send(books, "a")
    owner.send(books, "b")
    assert books.answered(first, now=1.0) is not None
    assert books.answered(first, now=2.0) is None  # failed already, as one that overran
    assert books.answered(99, now=2.0) is None
    assert owner.started == ["a", "b"] and len(books) == 1


def test_ids_count_up_and_are_never_used_again():
    books, owner = Books(), Owner()
    first = owner.send(books, "a")
    books.answered(first, now=1.0)
    assert owner.send(books, "b") == first + 1


def test_each_model_call_waited_on_is_room_for_one_more_batch_until_taken():
    books, owner = Books(staging=1), Owner()
    owner.send(books, "a")
    owner.send(books, "b")
    books.call_waits(7, now=3.0)  # a's execute waits on a call: b runs nested
    assert owner.started == ["a", "b"] and books.get(1).since == 3.0  # type: ignore[union-attr]
    assert (books.limit(), books.limit(staged=True)) == (2, 3)
    owner.send(books, "c")  # staged: a and b fill the room
    assert owner.started == ["a", "b"]
    books.call_taken(7)
    books.call_taken(7)  # taken twice (a repeated frame) frees no more room
    assert books.limit() == 1


def test_nested_room_stops_at_the_limit():
    books = Books()
    for call_id in range(NESTED_LIMIT + 5):
        books.call_waits(call_id, now=0.0)
    assert books.limit() == 1 + NESTED_LIMIT


@pytest.mark.parametrize(
    ("cause", "staged"),
    [
        # The process is gone: what never began there may run elsewhere.
        (FailureCause.INSTANCE, FailureCause.NOT_STARTED),
        # Its owner stops everything on purpose: nothing is to run anywhere.
        (FailureCause.STOPPED, FailureCause.STOPPED),
    ],
)
def test_a_gone_process_fails_what_it_held(cause: FailureCause, staged: FailureCause):
    books, owner = Books(staging=1), Owner()
    owner.send(books, "a")
    owner.send(books, "b")
    books.fail_all("it ended", cause)
    assert owner.done == {
        "a": BatchFailure("it ended", cause),
        "b": BatchFailure("it ended", staged),
    }
    assert len(books) == 0 and books.answered(0, now=1.0) is None


def test_a_resumed_stream_runs_again_from_then_and_an_ended_one_is_not_resumed():
    books, owner = Books(), Owner()
    batch_id = owner.send(books, "a", now=1.0)
    batch = books.get(batch_id)
    assert batch is not None
    batch.paused = True
    assert books.resume(batch_id, now=4.0)
    assert not batch.paused and batch.since == 4.0
    books.answered(batch_id, now=5.0)
    batch.paused = True
    assert not books.resume(batch_id, now=6.0)  # it ended meanwhile
    assert batch.paused and batch.since == 4.0


def test_a_cancelled_stream_gets_the_timeout_from_then_once():
    books, owner = Books(), Owner()
    batch_id = owner.send(books, "a", now=1.0)
    batch = books.get(batch_id)
    assert batch is not None
    batch.paused = True  # waiting for a client that has gone: no Resume is coming
    assert books.cancel(batch_id, now=3.0)
    assert batch.cancelled and not batch.paused and batch.since == 3.0
    assert not books.cancel(batch_id, now=4.0)  # already told
    assert batch.since == 3.0
    assert not books.cancel(99, now=4.0)
