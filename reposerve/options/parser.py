"""The ``reposerve`` parser, built from the table: one section of ``--help`` per topic, in
Triton's order, each flag's help ending with its default, and the commands beside
serving named at the top."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from reposerve.options.table import OPTIONS, Group, Option, default_of
from reposerve.settings import Settings


def build_parser(commands: Sequence[tuple[str, str]]) -> argparse.ArgumentParser:
    """``commands``: (name, what it does) of each ``reposerve NAME ...`` command."""
    names = ",".join(name for name, _ in commands)
    width = max(len(name) for name, _ in commands)
    listed = "\n".join(f"  {name:<{width}}  {summary}" for name, summary in commands)
    parser = argparse.ArgumentParser(
        prog="reposerve",
        usage=f"%(prog)s [OPTIONS]\n       %(prog)s {{{names}}} ...",
        description="Serve a model repository over KServe V2 HTTP and gRPC, with Triton's "
        "extensions and\nflag names (docs/cli.md lists the options below).\n\n"
        f"commands:\n{listed}\n(`reposerve COMMAND --help` gives a command's own options)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = Settings()
    groups = {group: parser.add_argument_group(group.value) for group in Group}
    for option in OPTIONS:
        arguments = _arguments(option, default_of(option, defaults))
        groups[option.group].add_argument(option.flag, **arguments)
    return parser


def help_text(option: Option, default: Any) -> str:
    """The option's help with its default, as --help and docs/cli.md show it."""
    shown = _shown_default(option, default)
    return option.help if shown is None else f"{option.help} (default: {shown})"


def _shown_default(option: Option, default: Any) -> str | None:
    """The default as a user would type it, or None where there is nothing to show (a
    switch, or a default the help describes in words)."""
    if option.switch or default is None or default in ("", [], ()):
        return None
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float):
        return f"{default:g}"
    if isinstance(default, (list, tuple)):
        return " ".join(str(item) for item in default)
    return str(default)


def _arguments(option: Option, default: Any) -> dict[str, Any]:
    # argparse reads help as a %-format (for %(default)s); the table's text is plain.
    arguments: dict[str, Any] = {"help": help_text(option, default).replace("%", "%%")}
    if option.switch:
        return {**arguments, "action": "store_true"}
    # A repeated flag starts from nothing, so that given values replace the default.
    arguments["default"] = None if option.repeat else default
    if option.repeat:
        arguments["action"] = "append"
    if option.parse is not None:
        arguments["type"] = option.parse
    if option.metavar is not None:
        arguments["metavar"] = option.metavar
    if option.choices is not None:
        arguments["choices"] = option.choices
    if option.alone_means_true:
        arguments.update(nargs="?", const=True)
    return arguments
