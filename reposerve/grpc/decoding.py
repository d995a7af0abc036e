"""Request messages as the gRPC front receives them: parsed by our own deserializer, so
bytes protobuf cannot parse are the client's error (INVALID_ARGUMENT, and inside a
ModelStreamInfer call only that message's), not a deserializer crash that gRPC reports as
UNKNOWN and that would end a whole stream. Status messages are cut to a length every
client takes in its trailers, however long a client string they echo."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

# gRPC clients refuse trailers past 8 KiB by default; the status message rides in them.
MAX_STATUS_MESSAGE = 4096


class Undecodable:
    """A request message that could not be parsed, and why."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def deserializer(message_class: Any) -> Callable[[bytes], Any]:
    """``message_class.FromString``, with an Undecodable for bytes it cannot parse."""
    name = message_class.DESCRIPTOR.name

    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except (DecodeError, RecursionError) as exc:
            return Undecodable(f"could not decode the {name} message: {exc}")

    return parse


def status_message(message: str) -> str:
    """``message`` cut to fit a status (the cut said so)."""
    if len(message) <= MAX_STATUS_MESSAGE:
        return message
    cut = len(message) - MAX_STATUS_MESSAGE
    return f"{message[:MAX_STATUS_MESSAGE]}... ({cut} more characters cut)"
