"""The dynamic batcher's rules as a pure function: what leaves now, what waits."""

from __future__ import annotations

import pytest

from reposerve.config import parse_model_config
from reposerve.scheduler.policy import BatchRules, Take, Wait, plan_batch

pytestmark = pytest.mark.unit

US = 1000  # ns


def rules(batching: str | None, max_batch: int = 8) -> BatchRules:
    text = f"max_batch_size = {max_batch}\n"
    if batching is not None:
        text += f"[dynamic_batching]\n{batching}\n"
    return BatchRules.from_config(parse_model_config(text, "m/config.toml"))


def test_without_dynamic_batching_every_request_runs_alone():
    assert plan_batch([1, 1, 1], 0, rules(None)) == Take(1, full=True)


def test_delay_zero_sends_everything_queued_now():
    assert plan_batch([1, 2, 1], 0, rules("max_queue_delay_microseconds = 0")) == Take(3)


def test_waits_for_the_delay_then_sends_what_is_there():
    policy = rules("max_queue_delay_microseconds = 500")
    assert plan_batch([1, 1], 100 * US, policy) == Wait(400 * US)
    assert plan_batch([1, 1], 500 * US, policy) == Take(2)


def test_full_batch_leaves_without_waiting():
    policy = rules("max_queue_delay_microseconds = 500", max_batch=4)
    assert plan_batch([2, 2], 0, policy) == Take(2, full=True)


def test_requests_are_packed_whole_never_split():
    policy = rules("max_queue_delay_microseconds = 500", max_batch=4)
    # 3 + 2 > 4: the second request cannot join, so the first leaves alone at once.
    assert plan_batch([3, 2], 0, policy) == Take(1, full=True)


def test_preferred_size_leaves_at_once():
    policy = rules("preferred_batch_size = [4, 8]\nmax_queue_delay_microseconds = 10000")
    assert plan_batch([1, 1, 1, 1], 0, policy) == Take(4)
    # 5 queued: the preferred 4 leave now, the fifth waits for more.
    assert plan_batch([1, 1, 1, 1, 1], 0, policy) == Take(4)
    assert plan_batch([4, 4], 0, policy) == Take(2, full=True)


def test_preferred_size_that_whole_requests_cannot_form_waits():
    policy = rules("preferred_batch_size = [4]\nmax_queue_delay_microseconds = 10000")
    assert plan_batch([2, 3], 0, policy) == Wait(10_000 * US)
    assert plan_batch([2, 3], 10_000 * US, policy) == Take(2)


def test_largest_preferred_size_wins():
    policy = rules("preferred_batch_size = [2, 4]\nmax_queue_delay_microseconds = 10000")
    assert plan_batch([1, 1, 1], 0, policy) == Take(2)
    assert plan_batch([1, 1, 1, 1, 1], 0, policy) == Take(4, full=True)


def test_only_batches_that_cannot_grow_are_full():
    """A full batch may be staged on a busy instance; any other waits for a free one,
    where it leaves with whatever arrived meanwhile."""
    policy = rules("preferred_batch_size = [2, 4]\nmax_queue_delay_microseconds = 0")
    assert plan_batch([1], 0, policy) == Take(1, full=False)  # delay over, could grow
    assert plan_batch([1, 1, 1], 0, policy) == Take(2, full=False)  # 4 is preferred too
    assert plan_batch([1, 1, 1, 1], 0, policy) == Take(4, full=True)
    assert plan_batch([8], 0, policy) == Take(1, full=True)  # max_batch_size
