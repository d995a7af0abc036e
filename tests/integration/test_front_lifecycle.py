"""The front processes' lifecycle against a shutdown that comes while they start:
``FrontWorkers`` in this process, its fronts real processes (gRPC only, on a free port).
The shutdown is called at a known point of the start, where a signal would race it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from reposerve.fronts.workers import FrontWorkers
from reposerve.server import Server
from reposerve.settings import Settings
from tools.bench.servers import children_of, free_port

pytestmark = pytest.mark.integration

FRONTS = 4  # the server's own process and three front processes


def _fronts(repository: Path) -> FrontWorkers:
    port = free_port()
    settings = Settings(
        model_repositories=(repository,),
        http_port=None,
        metrics_port=None,
        grpc_port=port,
        grpc_workers=FRONTS,
    )
    return Server(settings).fronts  # the server's, not started: its fronts alone


def _new_children(before: set[int]) -> set[int]:
    """This process's children but those it had before the test (other tests' servers)."""
    return set(children_of(os.getpid())) - before


def test_a_shutdown_during_the_start_starts_no_more_fronts(repository):
    before = set(children_of(os.getpid()))

    async def body() -> set[int]:
        fronts = _fronts(repository)
        starting = asyncio.create_task(fronts.start(None))
        await asyncio.sleep(0)  # the first front is spawned; the start waits on its link
        fronts.leave()  # what the shutdown does first
        await starting
        spawned = _new_children(before)
        await fronts.wait(30)
        return spawned

    assert len(asyncio.run(body())) == 1
    assert _new_children(before) == set()  # each one reaped


def test_the_shutdown_reaps_a_front_that_had_not_connected_yet(repository):
    before = set(children_of(os.getpid()))

    async def body() -> None:
        fronts = _fronts(repository)
        starting = asyncio.create_task(fronts.start(None))
        await asyncio.sleep(0)  # the first front is spawned, not linked yet
        await fronts.wait(30)
        await starting

    asyncio.run(body())
    assert _new_children(before) == set()  # none left running, none left a zombie
