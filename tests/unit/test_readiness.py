"""The front's side of a model's own readiness check: one question in flight per
instance, answers shared by everyone who waits, a timeout that leaves the question in
flight, and an instance that died answering not ready."""

from __future__ import annotations

import asyncio

import pytest

from reposerve.instance import readiness
from reposerve.instance.messages import ReadyAnswer, ReadyQuery
from reposerve.instance.readiness import ReadinessCheck

pytestmark = pytest.mark.unit


def _check() -> tuple[ReadinessCheck, list[ReadyQuery]]:
    sent: list[ReadyQuery] = []
    return ReadinessCheck("m_0_0", sent.append), sent


def test_callers_while_a_question_is_in_flight_share_its_answer():
    async def scenario() -> None:
        check, sent = _check()
        callers = [asyncio.ensure_future(check.ask()) for _ in range(5)]
        await asyncio.sleep(0)
        assert sent == [ReadyQuery(1)]
        check.answered(ReadyAnswer(1, True))
        assert await asyncio.gather(*callers) == [None] * 5
        # Answered: the next caller asks again.
        later = asyncio.ensure_future(check.ask())
        await asyncio.sleep(0)
        assert sent == [ReadyQuery(1), ReadyQuery(2)]
        check.answered(ReadyAnswer(2, False))
        assert await later == "Model 'm_0_0' is not ready (user-defined check failed)."

    asyncio.run(scenario())


def test_a_failed_check_says_why_and_a_stale_answer_is_ignored():
    async def scenario() -> None:
        check, sent = _check()
        caller = asyncio.ensure_future(check.ask())
        await asyncio.sleep(0)
        check.answered(ReadyAnswer(7, True))  # not the question in flight
        assert not caller.done()
        check.answered(ReadyAnswer(1, False, "RuntimeError: cold"))
        assert await caller == "RuntimeError: cold"

    asyncio.run(scenario())


def test_past_the_timeout_a_caller_is_told_not_ready_and_the_question_stays(monkeypatch):
    monkeypatch.setattr(readiness, "TIMEOUT_S", 0.01)

    async def scenario() -> None:
        check, sent = _check()
        assert await check.ask() == "Timed out waiting for user-defined is_ready() response"
        second = asyncio.ensure_future(check.ask())
        await asyncio.sleep(0)
        assert sent == [ReadyQuery(1)]  # the next caller waits for the same question
        check.answered(ReadyAnswer(1, True))
        assert await second is None

    asyncio.run(scenario())


def test_an_instance_that_dies_answers_its_question_not_ready():
    async def scenario() -> None:
        check, _ = _check()
        caller = asyncio.ensure_future(check.ask())
        await asyncio.sleep(0)
        check.gone()
        assert await caller == (
            "Stub process 'm_0_0' is not healthy while waiting for user-defined is_ready() response"
        )

    asyncio.run(scenario())
