"""Frames on a byte stream between reposerve's own processes: a 4-byte little-endian
length, then a msgpack-encoded (tagged) Struct."""

from __future__ import annotations

import struct

import msgspec

FRAME_HEADER = struct.Struct("<I")

_encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    payload = _encoder.encode(message)
    return FRAME_HEADER.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into decoded messages; fed whatever the socket returned."""

    def __init__(self, message_type: object) -> None:
        self._decoder = msgspec.msgpack.Decoder(message_type)
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list:
        buffer = self._buffer
        buffer += data
        messages = []
        start = 0
        header_size = FRAME_HEADER.size
        while len(buffer) - start >= header_size:
            (length,) = FRAME_HEADER.unpack_from(buffer, start)
            end = start + header_size + length
            if end > len(buffer):
                break
            messages.append(self._decoder.decode(memoryview(buffer)[start + header_size : end]))
            start = end
        if start:
            del buffer[:start]
        return messages
