"""A text log line is one record: what a client wrote cannot start a line of its own."""

from __future__ import annotations

import io
import logging

import pytest

from reposerve.logs import _formatter

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("style", ["default", "ISO8601"])
def test_line_breaks_in_a_message_are_escaped(style):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_formatter(style))
    logger = logging.getLogger(f"reposerve.test.{style}")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        forged = "x\n2026-12-02 13:00:00,000 ERROR reposerve: forged\r\x1b[2K"
        logger.error("unknown model '%s'", forged)
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("load of '%s' failed", "a\nb")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith(
        "unknown model 'x\\n2026-12-02 13:00:00,000 ERROR reposerve: forged\\r\\x1b[2K'"
    )
    assert lines[1].endswith("load of 'a\\nb' failed")
    # A traceback keeps its own lines after the message.
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom"
    assert not any("forged" in line for line in lines[1:])
