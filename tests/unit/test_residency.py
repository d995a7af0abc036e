"""Memory budgets as given on the command line, and which models eviction picks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from reposerve.arguments import parse_budget
from reposerve.repository.footprints import Footprint
from reposerve.repository.keeper import BudgetKeeper, Loading
from reposerve.repository.residency import (
    Residency,
    Resident,
    choose_victims,
    describe_footprint,
    refusal,
    residents_of,
)
from reposerve.statistics import MemoryUsage

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


def _resident(name, nbytes, used, busy=False, pinned=False, protected=None, gpu=None):
    held = Footprint(nbytes, gpu or {})
    return Resident(name, held, used, busy=busy, pinned=pinned, protected=protected)


def test_the_least_recently_used_go_first_until_enough_is_freed():
    residents = [_resident("new", 100, 3.0), _resident("old", 100, 1.0), _resident("mid", 100, 2.0)]
    assert [v.name for v in choose_victims(residents, Footprint(150))] == ["old", "mid"]
    assert [v.name for v in choose_victims(residents, Footprint(1))] == ["old"]


def test_busy_pinned_and_ensemble_steps_never_go():
    residents = [
        _resident("busy", 500, 0.0, busy=True),
        _resident("pinned", 500, 0.5, pinned=True),
        _resident("step", 500, 0.7, protected="a step of the resident ensemble 'e'"),
        _resident("idle", 100, 9.0),
    ]
    assert [v.name for v in choose_victims(residents, Footprint(100))] == ["idle"]
    assert choose_victims(residents, Footprint(101)) is None  # not enough can go


def test_a_gpu_over_its_budget_frees_only_models_holding_memory_on_it():
    residents = [
        _resident("host-only", 100, 0.0),
        _resident("on-gpu-1", 100, 1.0, gpu={1: 500}),
        _resident("on-gpu-0-old", 100, 2.0, gpu={0: 300}),
        _resident("on-gpu-0-new", 100, 3.0, gpu={0: 300}),
    ]
    chosen = choose_victims(residents, Footprint(0, {0: 400}))
    assert [v.name for v in chosen] == ["on-gpu-0-old", "on-gpu-0-new"]
    assert choose_victims(residents, Footprint(0, {0: 601})) is None


def test_host_and_gpu_over_together_are_freed_together():
    residents = [_resident("host-only", 100, 0.0), _resident("gpu", 10, 1.0, gpu={0: 300})]
    chosen = choose_victims(residents, Footprint(50, {0: 100}))
    assert [v.name for v in chosen] == ["host-only", "gpu"]


def test_the_gpu_budget_holds_on_each_gpu_alone():
    book = Residency(gpu_budget=parse_budget("50%"), gpu_memory=[1000, 4000])
    assert book.budgeted and book.tracking and book.gpu_limits == {0: 500, 1: 2000}
    residents = [_resident("a", 0, 0.0, gpu={0: 400, 1: 1900})]
    assert book.over(residents, Footprint(0, {1: 50})) == Footprint()
    assert book.over(residents, Footprint(0, {0: 150, 1: 150})) == Footprint(0, {0: 50, 1: 50})


def test_a_refusal_names_the_gpu_budget_it_is_over_and_its_holders():
    book = Residency(gpu_budget=parse_budget("50%"), gpu_memory=[1 << 30])
    holders = [_resident("big", 1 << 20, 0.0, pinned=True, gpu={0: 400 << 20})]
    needed = Footprint(1 << 20, {0: 300 << 20})
    message = refusal("new", needed, Footprint(0, {0: 188 << 20}), book, holders)
    assert "300 MiB, which does not fit the memory budget of GPU 0 50% (512 MiB)" in message
    assert "'big' 400 MiB (pinned)" in message and "--gpu-memory-budget" in message


def test_footprints_read_as_triton_memory_usage():
    assert Footprint().usage() == []  # never measured: an ensemble holds none of its own
    assert Footprint(5, {1: 7}).usage() == [MemoryUsage("CPU", 0, 5), MemoryUsage("GPU", 1, 7)]
    assert Footprint(1, {0: 2}) + Footprint(3, {0: 4, 1: 5}) == Footprint(4, {0: 6, 1: 5})
    assert describe_footprint(Footprint(84 << 20, {0: 3 << 30})) == "84 MiB, 3.0 GiB on GPU 0"


def test_a_name_never_loaded_keeps_nothing_once_its_requests_end():
    residency = Residency(on_demand=True, clock=lambda: 1.0)
    for _ in range(2):
        residency.begin("made-up")
    residency.end("made-up")
    assert residency.busy("made-up")  # one request still in progress
    residency.end("made-up")
    assert residency.last_used == {} and residency.active == {}


def test_a_loaded_model_held_in_use_stays_known_after():
    residency = Residency(on_demand=True, clock=lambda: 2.0)
    residency.loaded("real", Footprint(10), 0.1)
    with residency.in_use(["real", "step"]):
        assert residency.busy("real") and residency.busy("step")
    assert residency.active == {} and residency.last_used == {"real": 2.0}


def _version(steps=(), busy=False):
    """What eviction reads of a READY version: its steps, pipeline, scheduler, pinning."""
    config = SimpleNamespace(
        step=[SimpleNamespace(model=step) for step in steps],
        lifecycle=SimpleNamespace(pinned=False),
    )
    return SimpleNamespace(
        config=config, pipeline=bool(steps), scheduler=SimpleNamespace(busy=busy)
    )


MIB = 1 << 20
# An ensemble resident with one of its two steps: the other was evicted (its footprint as
# last measured stays in the book) and is loading again for the ensemble's request.
PAIR_MISSING_A_STEP = {"pair": [_version(steps=("w0", "w1"))], "w0": [_version()]}


def _book() -> Residency:
    residency = Residency(host_budget=parse_budget("230M"), on_demand=True)
    residency.footprints.update(w0=Footprint(67 * MIB), w1=Footprint(67 * MIB))
    return residency


def test_an_ensembles_unit_holds_only_the_steps_that_are_resident():
    [pair] = residents_of(PAIR_MISSING_A_STEP, _book(), exclude="w2")
    assert pair.name == "pair" and pair.held == Footprint(67 * MIB)


def test_a_load_counts_by_its_room_until_measured_and_a_reload_beside_its_old_version():
    """A first load's model may serve before the load is measured: it counts once, by the
    room made for it (its footprint is not known yet). A reload's new version loads
    while the old one serves: both count."""
    serving = {"w1": [_version()], "w3": [_version()]}
    keeper = BudgetKeeper(_book(), (), lambda: serving, unload=None)
    keeper._loads += [
        Loading("w1", Footprint(70 * MIB)),
        Loading("w3", Footprint(70 * MIB), beside=True),
    ]
    held = {(r.name, r.protected): r.held for r in keeper._residents(exclude="w2")}
    assert held == {
        ("w1", "loading"): Footprint(70 * MIB),
        ("w3", None): Footprint(),  # never measured in this book
        ("w3", "loading"): Footprint(70 * MIB),
    }
