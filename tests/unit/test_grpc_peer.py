"""Who the gRPC front takes a client for: the address in the peer string gRPC gives,
which loopback-only control is decided on."""

from __future__ import annotations

import pytest

from reposerve.grpc.server import _client_host

pytestmark = pytest.mark.unit


class _Context:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:50123", "127.0.0.1"),
        ("ipv6:[::1]:50123", "::1"),
        ("ipv6:%5B::1%5D:50123", "::1"),  # as grpcio writes it: a client of "localhost"
        ("unix:/tmp/socket", None),
    ],
)
def test_the_client_address_is_read_from_the_peer(peer, host):
    assert _client_host(_Context(peer)) == host  # type: ignore[arg-type]
