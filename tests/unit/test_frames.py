"""Control frames between the front and instances survive any split of the byte stream."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reposerve.framing import FrameReader
from reposerve.instance.messages import (
    Execute,
    Failure,
    FromInstance,
    Result,
    TensorRef,
    ToInstance,
    encode_frame,
)

pytestmark = pytest.mark.unit

refs = st.builds(
    TensorRef,
    name=st.text(max_size=8),
    datatype=st.sampled_from(["FP32", "BYTES", "INT64"]),
    shape=st.lists(st.integers(0, 64), max_size=3).map(tuple),
    offset=st.integers(0, 2**40),
    nbytes=st.integers(0, 2**40),
)
ids = st.integers(0, 2**62)
from_instance = st.one_of(
    st.builds(Result, ids, st.integers(1, 2**40), st.lists(refs, max_size=3), st.integers(0, 9)),
    st.builds(Failure, ids, st.text(max_size=200)),
)


@given(st.lists(from_instance, max_size=6), st.lists(st.integers(1, 40), max_size=30))
def test_frames_split_anywhere_decode_to_the_same_messages(messages, cuts):
    stream = b"".join(encode_frame(message) for message in messages)
    reader = FrameReader(FromInstance)
    decoded = []
    position = 0
    for size in cuts:  # reads of arbitrary sizes, as a socket may return them
        decoded += reader.feed(stream[position : position + size])
        position += size
    decoded += reader.feed(stream[position:])
    assert decoded == messages


def test_frames_to_instances_round_trip():
    message = Execute(7, 1, 1 << 20, [TensorRef("INPUT", "FP32", (2, 16), 0, 128)])
    assert FrameReader(ToInstance).feed(encode_frame(message)) == [message]
