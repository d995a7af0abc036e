"""Frames on a byte stream between reposerve's own processes: a 4-byte little-endian
length, then a msgpack-encoded (tagged) Struct."""

from __future__ import annotations

import asyncio
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


class Outgoing:
    """Frames for one transport, sent together at the end of the loop's turn: a front
    under load has many requests in a turn, and one system call carries them all."""

    __slots__ = ("_transport", "_loop", "_frames")

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        if not self._frames:
            self._loop.call_soon(self._flush)
        self._frames.append(frame)

    def _flush(self) -> None:
        frames, self._frames = self._frames, []
        if not self._transport.is_closing():
            self._transport.writelines(frames)
