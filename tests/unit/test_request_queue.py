"""The scheduler's queue as pure logic: priority levels, the counts dispatch reads, and
requests given up on, taken from the middle, or cleared."""

from __future__ import annotations

import asyncio

import pytest

from reposerve.config import DynamicBatching
from reposerve.scheduler.queue import RequestQueue
from reposerve.scheduler.work import Queued
from tests.scheduler_fakes import make_request

pytestmark = pytest.mark.unit


def _queued(loop: asyncio.AbstractEventLoop, rows: int, priority: int = 0) -> Queued:
    request = make_request([[float(rows)] * 2] * rows, priority=priority)
    return Queued(request, loop.create_future(), (("X", (2,)),), 0, None)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_higher_levels_leave_first_and_the_default_level_is_the_configs(loop):
    queue = RequestQueue(DynamicBatching(priority_levels=3, default_priority_level=2))
    low, default, high = _queued(loop, 1, 3), _queued(loop, 2), _queued(loop, 1, 1)
    for item in (low, default, high):
        queue.append(item)
    assert (queue.count, queue.items) == (3, 4)
    head, blocked = queue.head(max_batch_size=8, padding=None)
    assert head == [high, default, low] and not blocked
    assert list(queue.clear()) == [high, default, low]
    assert (queue.count, queue.items) == (0, 0)


def test_requests_given_up_leave_from_the_front_and_taken_ones_from_anywhere(loop):
    queue = RequestQueue(None)
    first, second, third = (_queued(loop, rows) for rows in (1, 2, 3))
    for item in (first, second, third):
        queue.append(item)
    first.future.cancel()
    third.future.cancel()  # not at the front: it stays until it is
    assert list(queue.given_up()) == [first]
    assert (queue.count, queue.items) == (2, 5)
    assert queue.take(second) and not queue.take(second)
    assert list(queue.given_up()) == [third] and queue.count == 0 == queue.items


def test_a_queue_with_a_size_limit_is_full_at_it(loop):
    queue = RequestQueue(DynamicBatching(max_queue_size=2))
    queue.append(_queued(loop, 1))
    assert not queue.full
    queue.append(_queued(loop, 1))
    assert queue.full
    assert not RequestQueue(None).full
