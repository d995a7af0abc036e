"""Command line: ``reposerve [OPTIONS]`` serves (flags -> Settings -> serve, with the
flags, their rules and their start-up checks all in reposerve.options), and the commands
beside it run instead: ``check`` (here), ``convert`` and ``tune``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from reposerve.errors import ConfigError
from reposerve.options.parser import build_parser
from reposerve.options.resolve import refusal, settings_from
from reposerve.repository.roots import all_model_names, find_root
from reposerve.repository.scan import read_model


def check_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reposerve check",
        description="Validate model repositories as a load would, one line per model; exit "
        "status 1 if a model is broken, 2 if a path is not a folder.",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="repository folders, served together as several --model-repository would be "
        "(default: model_repository)",
    )
    return parser


def check(argv: list[str]) -> int:
    """Validate repositories (served together, as several --model-repository would be):
    one line per model, exit 1 if any model is broken."""
    paths = check_parser().parse_args(argv).paths
    roots = [Path(path) for path in paths or ["model_repository"]]
    for root in roots:
        if not root.is_dir():
            print(f"{root}: not a folder")
            return 2
    broken = 0
    for name in all_model_names(roots):
        try:
            source = read_model(find_root(roots, name), name)
        except ConfigError as exc:
            broken += 1
            print(f"FAIL {exc.message}")
            continue
        versions = ",".join(str(v.number) for v in source.versions)
        backends = ",".join(sorted({v.backend for v in source.versions}))
        print(f"ok   {name} (versions {versions}; {backends})")
    return 1 if broken else 0


def _convert(argv: list[str]) -> int:
    from reposerve.convert import convert  # with the config writers, only when asked

    return convert(argv)


def _tune(argv: list[str]) -> int:
    from reposerve.tune.command import tune  # with the load generator and plots, only when asked

    return tune(argv)


class Command(msgspec.Struct, frozen=True):
    name: str
    summary: str  # what --help and docs/cli.md say it does
    run: Callable[[list[str]], int]


COMMANDS = (
    Command("check", "validate model repositories as a load would, one line per model", check),
    Command("convert", "print a Triton model folder's config.pbtxt as config.toml", _convert),
    Command("tune", "find a model's fastest configuration on this machine", _tune),
)


def serve_parser() -> argparse.ArgumentParser:
    return build_parser([(command.name, command.summary) for command in COMMANDS])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    for command in COMMANDS:
        if argv[:1] == [command.name]:
            return command.run(argv[1:])
    settings = settings_from(serve_parser().parse_args(argv))
    if (problem := refusal(settings)) is not None:
        print(f"reposerve: {problem}", file=sys.stderr)
        return 2
    from reposerve.server import serve

    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
