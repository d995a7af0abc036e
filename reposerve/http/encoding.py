"""Content codings on the infer endpoint, as Triton's HTTP server has them.

``tritonclient.http`` compresses a request body when asked
(``request_compression_algorithm="gzip"|"deflate"``: ``gzip.compress`` or
``zlib.compress`` of the whole body, with ``Content-Encoding``), and asks for a compressed
response with ``Accept-Encoding``. ``Inference-Header-Content-Length`` counts the JSON
header *before* compression, both ways, so the body is inflated whole before it is parsed,
and a response's header length is that of the uncompressed JSON.

Request bodies are inflated as they arrive and never past ``--http-max-input-size``:
every inflate call is told how much output it may make, so a small bomb (1 GiB of zeros
gzipped to 1 MB) costs the limit at most, and is refused as soon as it passes it.
"""

from __future__ import annotations

import zlib

from reposerve.errors import ProtocolError

CODINGS = ("gzip", "deflate")
ACCEPTED = b"gzip, deflate"  # what a 415 answers in Accept-Encoding

# zlib window bits: gzip framing, and "deflate" as HTTP defines it (the zlib format, RFC 1950).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# Level 1: most of the size saving at a fraction of zlib's default cost (level 6 is about
# three times slower), as plain HTTP clients ask for gzip by default and the front's CPU is
# the server's throughput.
_LEVEL = 1
# Most output one inflate call makes, so a large body is inflated in slices between
# which the event loop runs other requests.
SLICE = 1 << 20


def request_coding(value: bytes) -> str | None:
    """The coding named by a Content-Encoding header value; None for identity.

    Raises ValueError naming the value when it is not one this server inflates.
    """
    coding = value.strip().lower()
    if coding in (b"", b"identity"):
        return None
    if coding == b"gzip":
        return "gzip"
    if coding == b"deflate":
        return "deflate"
    raise ValueError(value.decode("latin-1"))


def response_coding(accept: bytes) -> str | None:
    """The coding to answer with for an Accept-Encoding value, by Triton's rule: of
    identity, gzip and deflate, the first with the highest q above 0 (None = identity)."""
    best, weight = None, 0.0
    for item in accept.decode("latin-1").split(","):
        name, _, parameters = item.partition(";")
        name = name.strip().lower()
        if name not in ("identity", "gzip", "deflate"):
            continue
        q = 1.0
        key, _, value = parameters.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value)
            except ValueError:
                continue
        if q > weight:
            best, weight = (None if name == "identity" else name), q
    return best


def compress(body: bytes, coding: str) -> bytes:
    return zlib.compress(body, _LEVEL, _WBITS[coding])


class Inflater:
    """Inflates one request body fed chunk by chunk, held to ``limit`` bytes of output."""

    def __init__(self, coding: str, limit: int) -> None:
        self.coding = coding
        self._limit = limit
        self._stream = zlib.decompressobj(_WBITS[coding])
        self._body = bytearray()
        self._held = b""  # input not inflated yet: the last call's output slice was full

    def feed(self, data: bytes) -> bool:
        """Inflate ``data`` (after any input held back) up to one slice of output.

        Returns True while input is held back: call ``feed(b"")`` again (after letting
        the event loop run) before feeding more.
        """
        if self._held:
            data = self._held + data
        stream = self._stream
        room = self._limit + 1 - len(self._body)  # >= 1: 0 would mean "no limit" to zlib
        try:
            self._body += stream.decompress(data, min(SLICE, room))
        except zlib.error as exc:
            raise ProtocolError(
                f"request body is not valid {self.coding} data (Content-Encoding: "
                f"{self.coding}): {exc}"
            ) from exc
        if len(self._body) > self._limit:
            raise ProtocolError(
                f"request body inflates to more than the {self._limit}-byte limit "
                f"(--http-max-input-size; Content-Encoding: {self.coding})"
            )
        self._held = stream.unconsumed_tail
        if stream.eof and stream.unused_data:
            if self.coding != "gzip":
                raise ProtocolError(
                    f"request body has {len(stream.unused_data)} bytes after the end of "
                    "its deflate stream"
                )
            # gzip allows several members one after another (RFC 1952 2.2).
            self._stream = zlib.decompressobj(_WBITS["gzip"])
            self._held = stream.unused_data
        return bool(self._held)

    def finish(self) -> bytearray:
        """The whole inflated body, once the compressed one has all been fed."""
        if not self._stream.eof:
            raise ProtocolError(
                f"request body ends in the middle of its {self.coding} stream (truncated)"
            )
        return self._body
