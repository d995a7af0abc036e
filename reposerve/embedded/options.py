"""An embedded server's options: the command's flags, named as Python keywords
(``model_control_mode="explicit"`` for ``--model-control-mode explicit``), read through
the same table, parser and start-up checks as the command's, so a value means the same
and a wrong one gets the same words. No front is started unless asked for (gRPC and
metrics may be; HTTP, whose server owns its event loop, is the command's): the process
that embeds the server calls it directly."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reposerve.errors import EmbeddedError
from reposerve.options.parser import build_parser
from reposerve.options.resolve import refusal, settings_from
from reposerve.options.table import OPTIONS
from reposerve.options.values import inference_front
from reposerve.settings import Settings

Repository = str | os.PathLike[str]

# Off unless given: the fronts (an embedding process calls in directly) and the front
# processes beside them.
_EMBEDDED_DEFAULTS = {
    "allow_http": False,
    "allow_grpc": False,
    "allow_metrics": False,
    "http_workers": 1,
    "grpc_workers": 1,
}
_BY_NAME = {option.dest: option for option in OPTIONS}
_FLAG_NAMED = re.compile(r"argument (--[a-z0-9-]+)(?:/[^:]*)?")


def settings_for(
    model_repository: Repository | Sequence[Repository], options: Mapping[str, Any]
) -> Settings:
    """Settings for a server on ``model_repository`` (one folder or several) with
    ``options`` (flag names with ``_`` for ``-``), or EmbeddedError saying what is wrong."""
    roots = (
        [model_repository]
        if isinstance(model_repository, str | os.PathLike)
        else list(model_repository)
    )
    if "model_repository" in options:
        raise EmbeddedError("model_repository: give it as the first argument, not an option")
    argv: list[str] = []
    for root in roots:
        argv += ["--model-repository", os.fspath(root)]  # a folder, or a bucket URL
    for name, value in {**_EMBEDDED_DEFAULTS, **options}.items():
        argv += _flag(name, value)
    parser = build_parser([("serve", "")])
    parser.exit_on_error = False
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        said = errors.getvalue().strip().splitlines()
        message = str(exc) if isinstance(exc, argparse.ArgumentError) else said[-1]
        # argparse names the flag; the caller wrote the keyword
        message = _FLAG_NAMED.sub(lambda found: found[1][2:].replace("-", "_"), message)
        raise EmbeddedError(message.removeprefix("reposerve: error: ")) from None
    settings = settings_from(args)
    if settings.http_port is not None:
        raise EmbeddedError(
            "allow_http: an embedded server opens no HTTP front (it owns no event loop for "
            "one); call it directly, or open gRPC with allow_grpc=True"
        )
    problem = refusal(settings, skip=(inference_front,))
    if problem is not None:
        raise EmbeddedError(problem)
    return settings


def _flag(name: str, value: Any) -> list[str]:
    """``name=value`` as the command line would say it (None: not given)."""
    option = _BY_NAME.get(name)
    if option is None:
        raise EmbeddedError(
            f"unknown option '{name}': the options are the command's flags, '-' written '_' "
            "(`reposerve --help` lists them)"
        )
    if name.startswith("log_"):
        raise EmbeddedError(
            f"{name}: an embedded server logs through this process's logging (the "
            "'reposerve' logger and those under it): configure them there"
        )
    if value is None:
        return []
    if option.switch:
        if not isinstance(value, bool):
            raise EmbeddedError(f"{name}: true or false, got {value!r}")
        return [option.flag] if value else []
    several = isinstance(value, Iterable) and not isinstance(value, str | bytes | os.PathLike)
    if several and not option.repeat:
        raise EmbeddedError(f"{name}: one value, got {value!r}")
    # ``--flag=value``: a value that begins with '-' is not taken for a flag
    return [f"{option.flag}={_text(item)}" for item in (value if several else [value])]


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
