"""Write docs/cli.md, the command line reference, from the table of flags
(reposerve/options/table.py) and the commands reposerve.cli runs:

    python -m tools.cli_reference > docs/cli.md

tests/tools/test_cli_reference.py fails when the committed page and the parser disagree.
"""

from __future__ import annotations

import sys

from reposerve.cli import COMMANDS
from reposerve.options.parser import help_text
from reposerve.options.table import OPTIONS, Group, Option, default_of
from reposerve.settings import Settings

HEADER = """\
# Command line

<!-- Written by `python -m tools.cli_reference > docs/cli.md` from the table of flags in
reposerve/options/table.py: change the table, then run it again. -->

`reposerve [OPTIONS]` serves a model repository over KServe V2 HTTP and gRPC. The options
are Triton's where Triton has one, in the groups of `tritonserver --help`; `reposerve
--help` prints the same text.

## Commands

Each runs instead of serving; `reposerve COMMAND --help` gives its own options.
"""


def render() -> str:
    lines = [HEADER]
    lines += [f"- `reposerve {command.name}`: {command.summary}" for command in COMMANDS]
    defaults = Settings()
    for group in Group:
        lines += ["", f"## {group.value}", ""]
        for option in OPTIONS:
            if option.group is group:
                # A bare * would start emphasis in Markdown.
                text = help_text(option, default_of(option, defaults)).replace("*", "\\*")
                lines.append(f"- `{usage(option)}`: {text}")
    return "\n".join(lines) + "\n"


def usage(option: Option) -> str:
    """The flag as typed, with what its value looks like (argparse's way of writing it)."""
    if option.switch:
        return option.flag
    value = option.metavar or "{" + ",".join(option.choices or ()) + "}"
    return f"{option.flag} [{value}]" if option.alone_means_true else f"{option.flag} {value}"


if __name__ == "__main__":
    sys.stdout.write(render())
