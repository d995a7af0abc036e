"""Content codings (reposerve.http.encoding) and the connection cap's choice of whom to
close (reposerve.http.connections), without a server."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reposerve.errors import ProtocolError
from reposerve.http.connections import ConnectionLimits
from reposerve.http.encoding import SLICE, Inflater, compress, request_coding, response_coding

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (b"gzip", "gzip"),
        (b"deflate", "deflate"),
        (b"gzip, deflate", "gzip"),  # equal weights: the first listed
        (b"deflate, gzip", "deflate"),
        (b"gzip;q=0.5, deflate", "deflate"),
        (b"identity;q=0.9, gzip;q=0.8", None),
        (b"br", None),
        (b"*", None),  # Triton answers identity to a wildcard
        (b"gzip;q=0", None),
        (b"gzip;q=x, deflate;q=0.1", "deflate"),  # a malformed weight skips its coding
        (b" GZIP ; q=1 ", "gzip"),
        (b"", None),
    ],
)
def test_response_coding_follows_triton(accept, chosen):
    assert response_coding(accept) == chosen


def test_request_coding():
    assert request_coding(b"gzip") == "gzip"
    assert request_coding(b" Deflate ") == "deflate"
    assert request_coding(b"identity") is None
    with pytest.raises(ValueError, match="br"):
        request_coding(b"br")
    with pytest.raises(ValueError, match="gzip, gzip"):
        request_coding(b"gzip, gzip")


def _inflate(inflater: Inflater, chunks: list[bytes]) -> bytes:
    for chunk in chunks:
        more = inflater.feed(chunk)
        while more:
            more = inflater.feed(b"")
    return bytes(inflater.finish())


@given(data=st.binary(max_size=4000), cuts=st.lists(st.integers(0, 4000), max_size=6))
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_inflates_however_the_body_is_split(coding, data, cuts):
    packed = compress(data, coding)
    edges = sorted({0, len(packed), *(cut % (len(packed) + 1) for cut in cuts)})
    chunks = [packed[a:b] for a, b in zip(edges, edges[1:], strict=False)]
    assert _inflate(Inflater(coding, len(data)), chunks) == data


def test_tritonclient_framing_inflates():
    body = b'{"inputs": []}' * 100
    assert _inflate(Inflater("gzip", 10_000), [gzip.compress(body)]) == body
    assert _inflate(Inflater("deflate", 10_000), [zlib.compress(body)]) == body


def test_output_comes_in_slices_and_stops_at_the_limit():
    packed = zlib.compress(bytes(5 * SLICE))
    inflater = Inflater("deflate", 5 * SLICE)
    calls = 1
    more = inflater.feed(packed)
    while more:
        calls += 1
        more = inflater.feed(b"")
    assert calls >= 5  # one slice of output per call
    assert len(inflater.finish()) == 5 * SLICE
    with pytest.raises(ProtocolError, match="inflates to more than the 1000-byte limit"):
        _inflate(Inflater("deflate", 1000), [zlib.compress(bytes(1001))])
    assert _inflate(Inflater("deflate", 1000), [zlib.compress(bytes(1000))]) == bytes(1000)


def test_gzip_members_concatenate():
    packed = gzip.compress(b"abc") + gzip.compress(b"def")
    assert _inflate(Inflater("gzip", 100), [packed[:5], packed[5:]]) == b"abcdef"


@pytest.mark.parametrize(
    ("coding", "packed", "message"),
    [
        ("gzip", zlib.compress(b"x"), "request body is not valid gzip data"),
        ("deflate", gzip.compress(b"x"), "request body is not valid deflate data"),
        ("gzip", gzip.compress(b"x" * 100)[:-3], "ends in the middle of its gzip stream"),
        ("gzip", b"", "ends in the middle of its gzip stream"),
        ("deflate", zlib.compress(b"x") + b"!", "1 bytes after the end of its deflate stream"),
    ],
)
def test_corrupt_bodies(coding, packed, message):
    with pytest.raises(ProtocolError, match=message):
        _inflate(Inflater(coding, 1000), [packed])


class _Connection:
    """Stands in for GuardedHttpTools: what the cap needs of a connection."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.admitted = limits.admit(self)  # type: ignore[arg-type]
        self.refused: int | None = None

    def refuse(self, status: int, message: str) -> None:
        self.refused = status
        self.limits.release(self)  # type: ignore[arg-type]


def test_cap_closes_the_longest_waiting_connection():
    limits = ConnectionLimits(30, 60, max_connections=3)
    a, b, c = (_Connection(limits) for _ in range(3))
    limits.waiting.pop(a)  # a runs a request: never closed to make room
    d = _Connection(limits)
    assert (a.refused, b.refused, c.refused, d.admitted) == (None, 503, None, True)
    assert limits.open == 3
    limits.waiting.pop(c)
    limits.waiting.pop(d)
    e = _Connection(limits)  # all three run requests: the newcomer is turned away
    assert e.admitted is False
    assert limits.open == 3
    limits.release(a)  # a closes
    assert _Connection(limits).admitted and limits.open == 3


def test_no_cap():
    limits = ConnectionLimits(0, 0, max_connections=0)
    connections = [_Connection(limits) for _ in range(100)]
    assert all(connection.admitted for connection in connections)
    assert limits.open == 100
