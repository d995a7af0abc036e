"""Parsed flags -> Settings, and the start-up refusals. A flag with a field fills it as
given; the rules below are the flags that combine, or that mean more than their value
(Triton's spellings of one setting, a port a flag turns off, a default read from the
machine or the environment)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import msgspec

from reposerve.fronts import default_workers, usable_cores
from reposerve.locations import RemoteRepository, RepositoryLocation
from reposerve.options.table import OPTIONS, default_of
from reposerve.options.values import LOG_LEVELS
from reposerve.settings import Settings

KUBERNETES_GRACE_SECS = 5.0  # endpoint removal reaches kube-proxy and ingresses in seconds


def settings_from(args: argparse.Namespace) -> Settings:
    flags, defaults = vars(args), Settings()
    fields = _fields(flags, defaults)
    return Settings(**{**fields, **_rules(flags, fields, defaults)})


def refusal(
    settings: Settings, skip: Collection[Callable[[Settings], str | None]] = ()
) -> str | None:
    """Why the server must not start with these settings (the first flag's check that
    fails, in the table's order), or None. ``skip``: checks that do not apply (an
    embedded server needs no front to serve inference on)."""
    for option in OPTIONS:
        check = option.check
        if check is not None and check not in skip and (problem := check(settings)) is not None:
            return problem
    return None


def _fields(flags: dict[str, Any], defaults: Settings) -> dict[str, Any]:
    """The fields the flags fill as given; "metrics.address" fills a field of the
    ``metrics`` Struct, the others of which keep their defaults."""
    fields: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for option in OPTIONS:
        if option.field is None:
            continue
        value = flags[option.dest]
        if option.repeat:  # given values replace the default, in the field's own type
            default = default_of(option, defaults)
            value = default if value is None else type(default)(value)
        head, _, tail = option.field.partition(".")
        if tail:
            nested.setdefault(head, {})[tail] = value
        else:
            fields[head] = value
    for head, values in nested.items():
        fields[head] = msgspec.structs.replace(getattr(defaults, head), **values)
    return fields


def _rules(flags: dict[str, Any], fields: dict[str, Any], defaults: Settings) -> dict[str, Any]:
    cores = usable_cores()
    return {
        "auto_complete": not (
            flags["disable_auto_complete_config"] or flags["strict_model_config"]
        ),
        "http_port": fields["http_port"] if flags["allow_http"] else None,
        "grpc_port": fields["grpc_port"] if flags["allow_grpc"] else None,
        "metrics_port": fields["metrics_port"] if flags["allow_metrics"] else None,
        # Later settings win, as in Triton.
        "metrics": msgspec.structs.replace(
            fields["metrics"], **dict(flags["metrics_config"] or ())
        ),
        **_repositories(flags["model_repository"], defaults),
        "model_control_mode": flags["model_control_mode"] or defaults.model_control_mode,
        "load_models": _start_models(flags["model_control_mode"], flags["load_model"]),
        "http_workers": flags["http_workers"] or default_workers(cores),
        "grpc_workers": flags["grpc_workers"] or default_workers(cores),
        "grpc_use_ssl": fields["grpc_use_ssl"] or fields["grpc_use_ssl_mutual"],
        "shutdown_grace_secs": _shutdown_grace(flags["shutdown_grace_secs"]),
        "openai_api_keys": _openai_keys(fields["openai_api_keys"]),
        **_log_levels(flags),
    }


def _repositories(given: list[RepositoryLocation] | None, defaults: Settings) -> dict[str, Any]:
    """--model-repository's values: the folders, and the remote repositories."""
    if given is None:
        return {"model_repositories": defaults.model_repositories}
    return {
        "model_repositories": tuple(where for where in given if isinstance(where, Path)),
        "remote_repositories": tuple(
            where for where in given if isinstance(where, RemoteRepository)
        ),
    }


def _start_models(mode: str | None, names: list[str] | None) -> list[str] | None:
    """The models loaded at start-up (None: every one). Triton's explicit mode loads only
    --load-model ones; reposerve's default (no mode given) loads every model."""
    if names is not None:
        return None if "*" in names else names
    return [] if mode in ("explicit", "on-demand") else None


def _shutdown_grace(value: float | None) -> float:
    """The flag, else a few seconds when running under Kubernetes (which sends SIGTERM
    while the replica is still in its Service's endpoints), else none."""
    if value is not None:
        return value
    return KUBERNETES_GRACE_SECS if os.environ.get("KUBERNETES_SERVICE_HOST") else 0.0


def _openai_keys(given: list[str]) -> list[str]:
    from_environment = os.environ.get("REPOSERVE_OPENAI_API_KEYS", "").split(",")
    return [key.strip() for key in [*given, *from_environment] if key.strip()]


def _log_levels(flags: dict[str, Any]) -> dict[str, Any]:
    """--log-level sets the defaults; Triton's own flags, when given, win."""
    rank = LOG_LEVELS.index(flags["log_level"])
    chosen = {
        "log_verbose": 1 if flags["log_level"] == "debug" else 0,
        "log_info": rank <= LOG_LEVELS.index("info"),
        "log_warning": rank <= LOG_LEVELS.index("warning"),
        "log_error": True,
    }
    return {key: value if flags[key] is None else flags[key] for key, value in chosen.items()}
