"""Triton's ``pb_utils.Logger`` for python models: their log lines go to the front, which
logs them with the server's settings (or, without a channel, to the instance's stderr)."""

from __future__ import annotations

import enum
import logging
import sys
from collections.abc import Callable

from reposerve.backends.base import ModelLog

_log = logging.getLogger("reposerve.model")


class LogLevel(enum.Enum):
    """A level of ``Logger.log`` (Triton's ``pb_utils.LogLevel``): only these are taken."""

    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG


def _check_message(message: object) -> str:
    if not isinstance(message, str):
        raise TypeError(f"Logger: the message must be a str, got {type(message)}")
    return message


class Logger:
    """Log lines from the model, on the instance's stderr (which is the server's).
    VERBOSE lines are kept back, as Triton does unless its --log-verbose is set."""

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        if not isinstance(level, LogLevel):
            raise TypeError(f"Logger.log: level must be a pb_utils.LogLevel, got {type(level)}")
        _write(level.value, _check_message(message))

    @staticmethod
    def log_info(message: str) -> None:
        _write(logging.INFO, _check_message(message))

    @staticmethod
    def log_warn(message: str) -> None:
        _write(logging.WARNING, _check_message(message))

    @staticmethod
    def log_error(message: str) -> None:
        _write(logging.ERROR, _check_message(message))

    @staticmethod
    def log_verbose(message: str) -> None:
        _write(logging.DEBUG, _check_message(message))


_log_sink: Callable[[ModelLog], None] | None = None  # the instance's channel to the front


def connect_logs(sink: Callable[[ModelLog], None] | None) -> None:
    """Model log lines go to the front as ModelLog frames (the worker's channel), which
    logs them with the server's settings; without a sink they go to this process's stderr."""
    global _log_sink
    _log_sink = sink


def _write(level: int, message: str) -> None:
    if _log_sink is not None:
        _log_sink(ModelLog(level, message))
    else:
        _log.log(level, message)


def start_logging(model_name: str) -> None:
    """Give the model's log lines the front's text format and its name; called once by
    the shim before ``initialize`` (the instance process configures no logging itself)."""
    global _log
    _log = logging.getLogger(f"reposerve.model.{model_name}")
    if not _log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)
        _log.propagate = False
