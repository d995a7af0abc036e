"""How a flag's text becomes its value, and the start-up checks on what the flags add up
to: the pieces ``table`` names in its entries."""

from __future__ import annotations

import argparse
import os

from reposerve.access import API_CATEGORIES
from reposerve.arguments import positive_int_at_most
from reposerve.errors import ConfigError
from reposerve.fronts import WORKERS_PER_CORE, max_workers, usable_cores
from reposerve.locations import RepositoryLocation, parse_location
from reposerve.metrics import MetricsOptions, parse_metrics_setting
from reposerve.repository import gpus
from reposerve.repository.remote.filesystems import remote_problem
from reposerve.repository.remote.mirrors import default_cache_dir
from reposerve.settings import RestrictedApi, Settings

LOG_LEVELS = ("debug", "info", "warning", "error")


def restricted(value: str) -> RestrictedApi:
    apis, _, header = value.partition(":")
    key, _, secret = header.partition("=")
    names = frozenset(api.strip() for api in apis.split(",") if api.strip())
    unknown = names - API_CATEGORIES
    if not names or not key or not secret or unknown:
        raise argparse.ArgumentTypeError(
            f"expected API[,API]:KEY=VALUE with API in {', '.join(sorted(API_CATEGORIES))}, "
            f"got {value!r}"
        )
    return RestrictedApi(names, key.lower(), secret)


def metrics_setting(value: str) -> tuple[str, object]:
    try:
        return parse_metrics_setting(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def workers(value: str) -> int:
    """The limit is read when a value is, so the table holds no machine's numbers."""
    limit = max_workers(usable_cores())
    return positive_int_at_most(limit, f"{WORKERS_PER_CORE} per usable core")(value)


workers.__name__ = "int"  # what argparse names in its messages


def log_format(value: str) -> str:
    return "default" if value == "text" else value  # text is Triton's default format


def repository_location(value: str) -> RepositoryLocation:
    try:
        return parse_location(value)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


repository_location.__name__ = "repository"  # what argparse names in its messages


def repositories_are_folders(settings: Settings) -> str | None:
    """Each local repository is a folder, each remote one can be read here (its fsspec
    package is installed, its credentials are complete), none is given twice."""
    for root in settings.model_repositories:
        if not root.is_dir():
            return f"model repository {root} is not a folder"
    for remote in settings.remote_repositories:
        if (problem := remote_problem(remote, os.environ)) is not None:
            return problem
    folders = {root.resolve() for root in settings.model_repositories}
    urls = {remote.url for remote in settings.remote_repositories}
    if len(folders) + len(urls) < len(settings.model_repositories + settings.remote_repositories):
        return "a --model-repository is given twice"
    return None


def cache_dir_writable(settings: Settings) -> str | None:
    if not settings.remote_repositories:
        return None
    folder = settings.repository_cache_dir or default_cache_dir(os.environ)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--repository-cache-dir {folder}: cannot create it ({exc.strerror})"
    if not os.access(folder, os.W_OK):
        return f"--repository-cache-dir {folder}: cannot write in it"
    return None


def log_file_writable(settings: Settings) -> str | None:
    folder = os.path.dirname(os.path.abspath(settings.log_file))
    if settings.log_file and not os.access(folder, os.W_OK):
        return f"--log-file: cannot write in {folder}"
    return None


def tls_pair(settings: Settings) -> str | None:
    if bool(settings.ssl_certfile) != bool(settings.ssl_keyfile):
        return "--ssl-certfile and --ssl-keyfile go together"
    return None


def inference_front(settings: Settings) -> str | None:
    if settings.http_port is None and settings.grpc_port is None:
        return (
            "nothing to serve inference on: --allow-http and --allow-grpc are both false; allow one"
        )
    return None


def gpu_visible(settings: Settings) -> str | None:
    if settings.gpu_memory_budget and not gpus.discover().visible:
        return (
            f"--gpu-memory-budget {settings.gpu_memory_budget.text}: "
            f"{gpus.discover().describe()}; drop the flag, or make a GPU visible"
        )
    return None


def metrics_config_help() -> str:
    defaults = MetricsOptions()
    quantiles = ",".join(f"{q:g}:{e:g}" for q, e in defaults.summary_quantiles)
    return (
        "Triton's metrics settings, repeatable: "
        f"counter_latencies=true|false ({str(defaults.counter_latencies).lower()}), "
        f"summary_latencies=true|false ({str(defaults.summary_latencies).lower()}), "
        f"summary_quantiles=Q:E,... ({quantiles}); a later setting wins"
    )
