"""The table of flags: `reposerve --help` by topic, defaults taken from Settings, and the
start-up refusals each flag's check makes."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from reposerve.cli import COMMANDS, serve_parser
from reposerve.options.resolve import refusal
from reposerve.options.table import OPTIONS, Group, default_of
from reposerve.settings import Settings
from reposerve.shared_memory import MAX_REGIONS

pytestmark = pytest.mark.unit

TRITON_GROUPS = [
    "Server",
    "Logging",
    "Model Repository",
    "HTTP",
    "GRPC",
    "Metrics",
    "Memory/Device Management",
    "DEPRECATED",
]


def test_help_shows_the_flags_by_topic_in_tritons_order_and_names_the_commands():
    text = serve_parser().format_help()
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and line[0] != " "]
    assert headings == ["commands", "options", *TRITON_GROUPS]
    assert text.startswith("usage: reposerve [OPTIONS]\n       reposerve {check,convert,tune} ...")
    listed = text.split("commands:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in listed[:-1]] == ["check", "convert", "tune"]
    assert [command.name for command in COMMANDS] == ["check", "convert", "tune"]
    section = text.split("\nHTTP:\n")[1].split("\n\n")[0]
    assert "--http-port PORT      HTTP port (default: 8000)" in section


def test_each_group_is_one_of_tritons_and_none_is_empty():
    assert [group.value for group in Group] == TRITON_GROUPS
    assert {option.group for option in OPTIONS} == set(Group)


def test_a_flag_with_a_field_takes_the_fields_default():
    fields = set(Settings.__struct_fields__)
    for option in OPTIONS:
        if option.field is not None:
            assert option.field.split(".")[0] in fields, option.flag
            assert option.default is None, f"{option.flag}: its default is its field's"
    defaults = Settings()
    by_flag = {option.flag: option for option in OPTIONS}
    assert default_of(by_flag["--http-port"], defaults) == 8000
    assert default_of(by_flag["--metrics-interval-ms"], defaults) == 2000.0
    # Settings (a leaf) cannot import the shared-memory layer's limit: it mirrors it.
    assert default_of(by_flag["--client-shm-max-regions"], defaults) == MAX_REGIONS


def test_flags_are_declared_once():
    flags = [option.flag for option in OPTIONS]
    assert len(flags) == len(set(flags))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, None),
        ({"ssl_certfile": "cert.pem"}, "--ssl-certfile and --ssl-keyfile go together"),
        (
            {"http_port": None, "grpc_port": None},
            "nothing to serve inference on: --allow-http and --allow-grpc are both false; "
            "allow one",
        ),
        (
            {"model_repositories": (Path("/nowhere"),)},
            "model repository /nowhere is not a folder",
        ),
    ],
)
def test_refusals_name_the_flag_that_set_them(tmp_path, changes, expected):
    settings = Settings(model_repositories=(tmp_path,))
    assert refusal(msgspec.structs.replace(settings, **changes)) == expected


def test_a_repository_given_twice_is_refused(tmp_path):
    settings = Settings(model_repositories=(tmp_path, tmp_path))
    assert refusal(settings) == "a --model-repository is given twice"
