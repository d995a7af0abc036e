"""``Options``: Triton's server options, field for field, and their reading as an embedded
reposerve server's (``reposerve.embedded``): the repository folders and the command's
flags as keywords. Checked when the server starts, as Triton checks them: a value of the
wrong type is a TypeError naming the field; an option reposerve cannot honour, set to
other than Triton's default, is an UnsupportedError naming it. Host-tuning knobs that do
not change what a caller sees (memory pools, thread counts, plug-in folders, metrics
collection) are taken and have no effect."""

from __future__ import annotations

import logging
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from reposerve.tritonserver.enums import (
    InstanceGroupKind,
    LogFormat,
    ModelControlMode,
    RateLimitMode,
)
from reposerve.tritonserver.errors import InvalidArgumentError, UnsupportedError


@dataclass(slots=True)
class RateLimiterResource:
    name: str
    count: int
    device: int


@dataclass(slots=True)
class ModelLoadDeviceLimit:
    kind: InstanceGroupKind
    device: int
    fraction: float


@dataclass(slots=True)
class Options:
    """Triton's ``tritonserver.Options``: the same fields, types and defaults."""

    model_repository: str | list[str] = field(default_factory=list)
    server_id: str = "triton"
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    startup_models: list[str] = field(default_factory=list)
    strict_model_config: bool = False
    rate_limiter_mode: RateLimitMode = RateLimitMode.OFF
    rate_limiter_resources: list[RateLimiterResource] = field(default_factory=list)
    pinned_memory_pool_size: int = 1 << 28
    cuda_memory_pool_sizes: dict[int, int] = field(default_factory=dict)
    cache_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_directory: str = "/opt/tritonserver/caches"
    min_supported_compute_capability: float = 6.0
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout: int = 30
    buffer_manager_thread_count: int = 0
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0
    model_namespacing: bool = False
    enable_peer_access: bool = True
    log_file: str | None = None
    log_info: bool = False
    log_warn: bool = False
    log_error: bool = False
    log_format: LogFormat = LogFormat.DEFAULT
    log_verbose: int = 0
    metrics: bool = True
    gpu_metrics: bool = True
    cpu_metrics: bool = True
    metrics_interval: int = 2000
    backend_directory: str = "/opt/tritonserver/backends"
    repo_agent_directory: str = "/opt/tritonserver/repoagents"
    model_load_device_limits: list[ModelLoadDeviceLimit] = field(default_factory=list)
    backend_configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    metrics_configuration: dict[str, dict[str, str]] = field(default_factory=dict)


# Triton's options reposerve has no counterpart for; each must keep Triton's default.
_DEFAULT_ONLY = (
    "rate_limiter_mode",
    "rate_limiter_resources",
    "cuda_memory_pool_sizes",
    "cache_config",
    "model_load_retry_count",
    "model_namespacing",
    "log_format",
    "model_load_device_limits",
    "backend_configuration",
    "host_policies",
    "metrics_configuration",
)
_NO_REPOSITORY = "model_repository: no model repository given"
_CONTROL_MODES = {
    ModelControlMode.NONE: "none",
    ModelControlMode.POLL: "poll",
    ModelControlMode.EXPLICIT: "explicit",
}


def embedded_arguments(options: Options) -> tuple[list[str], dict[str, Any]]:
    """The repository folders and the embedded server's keywords ``options`` ask for."""
    if options.model_repository is None:  # Triton's "not given"
        raise InvalidArgumentError(_NO_REPOSITORY)
    _check_types(options)
    defaults = Options()
    for name in _DEFAULT_ONLY:
        if getattr(options, name) != getattr(defaults, name):
            raise UnsupportedError(
                f"option {name}={getattr(options, name)!r}: reposerve has no counterpart "
                f"(leave it at Triton's default, {getattr(defaults, name)!r})"
            )
    repositories = (
        [options.model_repository]
        if isinstance(options.model_repository, str)
        else list(options.model_repository)
    )
    if not repositories:
        raise InvalidArgumentError(_NO_REPOSITORY)
    keywords: dict[str, Any] = {
        "server_name": options.server_id,
        "model_control_mode": _CONTROL_MODES[options.model_control_mode],
        "strict_model_config": options.strict_model_config,
        "exit_on_error": options.exit_on_error,
        "strict_readiness": options.strict_readiness,
        "exit_timeout_secs": options.exit_timeout,
        "model_load_thread_count": options.model_load_thread_count,
    }
    if options.startup_models:
        keywords["load_model"] = list(options.startup_models)
    return repositories, keywords


def log_level(options: Options) -> int | None:
    """The least severe level ``log_*`` ask for (Triton's cascade: verbose takes info,
    info takes warnings, warnings take errors), or None for none."""
    if options.log_verbose > 0:
        return logging.DEBUG
    if options.log_info:
        return logging.INFO
    if options.log_warn:
        return logging.WARNING
    if options.log_error:
        return logging.ERROR
    return None


def _check_types(options: Options) -> None:
    hints = typing.get_type_hints(Options)
    for option in fields(Options):
        value = getattr(options, option.name)
        if not _fits(value, hints[option.name]):
            raise TypeError(
                f"option {option.name}: expected {_named(hints[option.name])}, got "
                f"{type(value).__name__} {value!r}"
            )


def _fits(value: Any, hint: Any) -> bool:
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, argument) for argument in arguments)
    if origin is list:
        return isinstance(value, list) and all(_fits(item, arguments[0]) for item in value)
    if origin is dict:
        key, item = arguments
        return isinstance(value, dict) and all(
            _fits(k, key) and _fits(v, item) for k, v in value.items()
        )
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, hint)


def _named(hint: Any) -> str:
    if hint is int:
        return "a non-negative int"
    return getattr(hint, "__name__", str(hint)) if isinstance(hint, type) else str(hint)
