"""Memory budgets as given on the command line, and which models eviction picks."""

from __future__ import annotations

import pytest

from reposerve.arguments import parse_budget
from reposerve.repository.residency import Resident, choose_victims

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1500000000", 1_500_000_000),
        ("1.5G", 3 << 29),
        ("512M", 512 << 20),
        ("512MiB", 512 << 20),
        ("2gb", 2 << 30),
        ("64k", 64 << 10),
        ("100B", 100),
    ],
)
def test_budgets_in_bytes(text, nbytes):
    assert parse_budget(text).of(total=0) == nbytes


def test_a_share_of_the_total():
    assert parse_budget("60%").of(total=1000) == 600


@pytest.mark.parametrize("text", ["0", "-1G", "0%", "150%", "12X", "G", "lots"])
def test_what_is_not_a_budget_says_so(text):
    with pytest.raises(ValueError):
        parse_budget(text)


def _resident(name, nbytes, used, busy=False, pinned=False, protected=None):
    return Resident(name, nbytes, used, busy=busy, pinned=pinned, protected=protected)


def test_the_least_recently_used_go_first_until_enough_is_freed():
    residents = [_resident("new", 100, 3.0), _resident("old", 100, 1.0), _resident("mid", 100, 2.0)]
    assert [v.name for v in choose_victims(residents, 150)] == ["old", "mid"]
    assert [v.name for v in choose_victims(residents, 1)] == ["old"]


def test_busy_pinned_and_ensemble_steps_never_go():
    residents = [
        _resident("busy", 500, 0.0, busy=True),
        _resident("pinned", 500, 0.5, pinned=True),
        _resident("step", 500, 0.7, protected="a step of the resident ensemble 'e'"),
        _resident("idle", 100, 9.0),
    ]
    assert [v.name for v in choose_victims(residents, 100)] == ["idle"]
    assert choose_victims(residents, 101) is None  # not enough can go
