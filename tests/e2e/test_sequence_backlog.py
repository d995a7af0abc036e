"""A sequence's wait for a slot, through a real server: an HTTP client that gives up while
its START waits in the backlog cancels it (through front workers too), so it never takes
a slot; and a request's ``timeout`` parameter bounds that wait, as Triton's schedule
policy has it for sequences."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from tests.probes import metric, stats, wait_for
from tests.sequence_models import ACCUMULATE_BASE, write_accumulate
from tests.server import Server, start_server

pytestmark = pytest.mark.e2e

MODEL = "held"  # one candidate sequence on each of its two instances: two slots
HELD = (1, 2)
ABANDONED = 300


FRONTS = {
    "one-front": (),
    "two-fronts": ("--http-workers", "2"),  # the cancel crosses from a front to the core
    "hypercorn": ("--http-server", "hypercorn"),  # its own way of telling a disconnect
}


@pytest.fixture(scope="module", params=list(FRONTS))
def server(request, tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("repository")
    write_accumulate(
        root,
        MODEL,
        strategy="oldest",
        strategy_settings="max_candidate_sequences = 1",
        idle_us=600_000_000,  # a held sequence stays held for the whole test
    )
    server = start_server(root, tmp_path_factory.mktemp("log"), *FRONTS[request.param])
    yield server
    assert server.stop() == 0, server.log()


def _body(key: int, start: bool = False, end: bool = False, **parameters: int) -> bytes:
    return msgspec.json.encode(
        {
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}],
            "parameters": {
                "sequence_id": key,
                "sequence_start": start,
                "sequence_end": end,
                **parameters,
            },
        }
    )


def _infer(client: httpx.Client, body: bytes) -> httpx.Response:
    return client.post(f"/v2/models/{MODEL}/infer", content=body)


@contextlib.contextmanager
def _slots_held(client: httpx.Client) -> Iterator[None]:
    """Both slots taken by open sequences for the block; ended after it."""
    for key in HELD:
        assert _infer(client, _body(key, start=True)).status_code == 200
    try:
        yield
    finally:
        for key in HELD:
            _infer(client, _body(key, end=True))


def _pending(server: Server) -> float:
    return metric(server, "nv_inference_pending_request_count", MODEL)


def _abandoned_start(server: Server, key: int) -> socket.socket:
    """A connection that sent a whole START for ``key``, left for its caller to close."""
    body = _body(key, start=True)
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    connection.sendall(head.encode() + body)
    return connection


def test_starts_abandoned_in_the_backlog_never_take_a_slot(server):
    with httpx.Client(base_url=server.url, timeout=60) as client, _slots_held(client):
        ran_before = stats(server, MODEL)["inference_count"]
        connections = [_abandoned_start(server, 1000 + i) for i in range(ABANDONED)]
        wait_for(lambda: _pending(server) == ABANDONED, 120, "every START in the backlog")
        for connection in connections:
            connection.close()  # the clients give up
        wait_for(lambda: _pending(server) == 0, 120, "the backlog to empty")
        # A slot frees: a fresh sequence gets it at once, not an abandoned one.
        assert _infer(client, _body(HELD[0], end=True)).status_code == 200
        fresh = _infer(client, _body(5000, start=True, end=True))
        assert fresh.status_code == 200, fresh.text
        assert fresh.json()["outputs"][0]["data"] == [ACCUMULATE_BASE + 1]
        # Of the 302 requests sent since the slots were taken, the model ran the 2 whose
        # clients stayed for their answers.
        assert stats(server, MODEL)["inference_count"] - ran_before == 2
        # The abandoned sequences are gone, not left open.
        unknown = _infer(client, _body(1000))
        assert unknown.status_code == 400
        assert "must specify the START flag" in unknown.json()["error"]


def test_a_timeout_bounds_the_wait_for_a_slot(server):
    with httpx.Client(base_url=server.url, timeout=60) as client, _slots_held(client):
        # Triton: the timeout applies while the sequence has no slot; then the request
        # and its sequence end.
        late = _infer(client, _body(7000, start=True, timeout=200_000))
        assert late.status_code == 503
        assert late.json()["error"] == (
            f"model '{MODEL}' version 1: timeout of sequence 7000 expired: a request of it "
            "waited 200000 us (its timeout parameter) without a sequence slot, so the "
            "sequence and its requests were dropped; start it again"
        )
        assert _infer(client, _body(7000)).status_code == 400  # its sequence is gone
        assert _pending(server) == 0
        # A sequence holding its slot is not timed out, however short its timeout.
        held = _infer(client, _body(HELD[1], timeout=1))
        assert held.status_code == 200, held.text
