"""Server logging: where log lines go, which levels pass, and how a line looks.

Triton's settings, as one value: ``log_info``, ``log_warning`` and ``log_error`` switch
each level on or off, and ``log_verbose_level`` N > 0 lets verbose lines of levels 1..N
through (level 1 is ``logging.DEBUG``, level 2 one below it, and so on: use
``verbose(n)`` to log at level n). The CLI sets them at start-up (``--log-*``); Triton's
logging extension (``GET``/``POST /v2/logging``) reads and changes them while the server
runs. ``log_file`` is fixed at start-up, as in Triton: a network client may not choose
where the server writes files.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Annotated, TextIO, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType

from reposerve.errors import ProtocolError
from reposerve.settings import LogFormat, Settings


def verbose(level: int) -> int:
    """The ``logging`` level of verbose level ``level`` (1 = DEBUG, 2 = DEBUG - 1, ...)."""
    return logging.DEBUG + 1 - level


class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The logging extension's settings document (what ``GET /v2/logging`` returns)."""

    log_file: str = ""  # "": the console (stderr)
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: LogFormat = "default"


class LogUpdate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A change of settings (a ``POST /v2/logging`` body): only those it names change."""

    log_file: str | UnsetType = UNSET
    log_info: bool | UnsetType = UNSET
    log_warning: bool | UnsetType = UNSET
    log_error: bool | UnsetType = UNSET
    log_verbose_level: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    log_format: LogFormat | UnsetType = UNSET


_update_decoder = msgspec.json.Decoder(LogUpdate)
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogControl:
    """Owns the root logger's one handler, and the settings that filter and format it."""

    def __init__(self, settings: LogSettings, stream: TextIO) -> None:
        self._handler = logging.StreamHandler(stream)
        self._handler.addFilter(self._passes)
        logging.getLogger().handlers[:] = [self._handler]
        self.settings = settings
        self._apply(settings)

    def update(self, update: LogUpdate) -> LogSettings:
        """Apply ``update``; returns the whole settings after it."""
        if update.log_file is not UNSET and update.log_file != self.settings.log_file:
            raise ProtocolError(
                "log settings: log_file can not be updated through the network protocol; "
                "restart the server with --log-file"
            )
        changes = {
            field: value
            for field in update.__struct_fields__
            if (value := getattr(update, field)) is not UNSET
        }
        settings = msgspec.structs.replace(self.settings, **changes)
        self._apply(settings)
        logging.getLogger("reposerve").info(
            "log settings changed: %s", ", ".join(f"{k}={v}" for k, v in changes.items())
        )
        return settings

    def _apply(self, settings: LogSettings) -> None:
        self.settings = settings
        self._handler.setFormatter(_formatter(settings.log_format))
        # Records below the root's level are never built: keep it at the lowest that passes.
        lowest = verbose(settings.log_verbose_level) if settings.log_verbose_level else logging.INFO
        logging.getLogger().setLevel(lowest)

    def _passes(self, record: logging.LogRecord) -> bool:
        settings = self.settings
        if record.levelno >= logging.ERROR:
            return settings.log_error
        if record.levelno >= logging.WARNING:
            return settings.log_warning
        if record.levelno >= logging.INFO:
            return settings.log_info
        return settings.log_verbose_level >= max(1, logging.DEBUG + 1 - record.levelno)


def decode_log_update(body: bytes) -> LogUpdate:
    """A ``POST /v2/logging`` body (empty: no change)."""
    try:
        return _update_decoder.decode(body or b"{}")
    except msgspec.ValidationError as exc:
        message = str(exc)
        if message.startswith("Invalid enum value"):  # say what would be valid
            message += f" (expected one of {', '.join(get_args(LogFormat))})"
        raise ProtocolError(f"log settings: {message}") from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ProtocolError(f"log settings: malformed request JSON: {exc}") from exc


def redirect_output(path: str) -> None:
    """Send everything this process and its children write to stdout and stderr (log
    lines, instance processes' tracebacks) to the end of ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


class _JsonFormatter(logging.Formatter):
    _encoder = msgspec.json.Encoder()

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return self._encoder.encode(document).decode()


# Control characters (but tab) as escapes: a message may hold what a client wrote.
_ESCAPES = {c: f"\\x{c:02x}" for c in range(32) if c != 9} | {10: "\\n", 13: "\\r"}


class _TextFormatter(logging.Formatter):
    """One record, one line: line breaks and other control characters in a message (a
    model name a client sent, a model's own text) are written escaped, so no client can
    forge a line of the log. A traceback, appended after the message, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's
        return super().formatMessage(record).translate(_ESCAPES)


class _IsoFormatter(_TextFormatter):
    """Triton's ISO8601 format: UTC time with a Z."""

    def __init__(self) -> None:
        super().__init__(_TEXT, datefmt="%Y-%m-%dT%H:%M:%SZ")
        self.converter = time.gmtime


def _formatter(style: LogFormat) -> logging.Formatter:
    if style == "json":
        return _JsonFormatter()
    if style == "ISO8601":
        return _IsoFormatter()
    return _TextFormatter(_TEXT)


def start_logging(settings: Settings) -> LogControl:
    """Route this process's output (and its instances') as the --log-* flags say."""
    if settings.log_file:
        redirect_output(settings.log_file)
    return LogControl(
        LogSettings(
            log_file=settings.log_file,
            log_info=settings.log_info,
            log_warning=settings.log_warning,
            log_error=settings.log_error,
            log_verbose_level=settings.log_verbose,
            log_format=settings.log_format,
        ),
        sys.stderr,
    )
