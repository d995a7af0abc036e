"""docs/cli.md, the command line reference: written from the table of flags, and saying
what the parser reads, flag for flag."""

from __future__ import annotations

import re

import pytest

from reposerve.cli import serve_parser
from tests.server import REPO_ROOT
from tools.cli_reference import render

pytestmark = pytest.mark.unit

PAGE = REPO_ROOT / "docs" / "cli.md"
LISTED = re.compile(r"^- `(--[a-z0-9-]+)[^`]*`: (.*)$", re.MULTILINE)


def test_the_committed_page_is_the_one_the_table_writes():
    assert PAGE.read_text() == render(), (
        "docs/cli.md is out of date: run python -m tools.cli_reference > docs/cli.md"
    )


def test_the_page_lists_every_flag_the_parser_reads_with_its_help():
    """Read against the parser itself, not the table: a flag added to the parser any other
    way, or a help or default changed without writing the page again, fails here."""
    listed = {flag: text.replace("\\*", "*") for flag, text in LISTED.findall(PAGE.read_text())}
    parsed = {
        action.option_strings[0]: action.help % {}  # argparse's %-format: 60%% reads 60%
        for action in serve_parser()._actions
        if action.option_strings and action.option_strings[0] != "-h"
    }
    assert listed == parsed
