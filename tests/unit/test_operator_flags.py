"""Triton's operator flags: how they reach Settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from reposerve.cli import serve_parser, settings_from

pytestmark = pytest.mark.unit


def _settings(*argv: str):
    return settings_from(serve_parser().parse_args(list(argv)))


def test_defaults():
    settings = _settings()
    assert settings.model_repositories == (Path("model_repository"),)
    assert settings.auto_complete and settings.model_load_thread_count == 4
    assert (settings.log_info, settings.log_warning, settings.log_error) == (True, True, True)
    assert (settings.log_verbose, settings.log_file, settings.log_format) == (0, "", "default")


def test_repositories_accumulate():
    settings = _settings("--model-repository", "a", "--model-repository", "b")
    assert settings.model_repositories == (Path("a"), Path("b"))


@pytest.mark.parametrize(
    ("argv", "auto_complete"),
    [
        ((), True),
        (("--disable-auto-complete-config",), False),
        (("--strict-model-config", "true"), False),
        (("--strict-model-config", "false"), True),
    ],
)
def test_auto_complete_flags(argv, auto_complete):
    assert _settings(*argv).auto_complete is auto_complete


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("--log-level", "debug"), (1, True, True, True)),
        (("--log-level", "warning"), (0, False, True, True)),
        (("--log-level", "error"), (0, False, False, True)),
        # Triton's own flags win over --log-level.
        (
            ("--log-level", "error", "--log-info", "true", "--log-verbose", "3"),
            (3, True, False, True),
        ),
        (("--log-error", "false"), (0, True, True, False)),
    ],
)
def test_log_level_and_tritons_log_flags(argv, expected):
    settings = _settings(*argv)
    got = (settings.log_verbose, settings.log_info, settings.log_warning, settings.log_error)
    assert got == expected


def test_text_format_is_tritons_default():
    assert _settings("--log-format", "text").log_format == "default"


@pytest.mark.parametrize("argv", [("--model-load-thread-count", "0"), ("--log-verbose", "-1")])
def test_bad_values_are_refused(argv):
    with pytest.raises(SystemExit):
        serve_parser().parse_args(list(argv))


def test_the_shutdown_grace_defaults_to_a_few_seconds_under_kubernetes(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert _settings().shutdown_grace_secs == 0
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert _settings().shutdown_grace_secs == 5
    assert _settings("--shutdown-grace-secs", "0").shutdown_grace_secs == 0
    with pytest.raises(SystemExit):
        _settings("--shutdown-grace-secs", "-1")


@pytest.mark.parametrize(
    ("argv", "mode", "loaded"),
    [
        ((), "explicit", None),  # reposerve's default: every model, control API on
        (("--model-control-mode", "explicit"), "explicit", []),  # Triton's: none
        (("--model-control-mode=explicit", "--load-model", "a"), "explicit", ["a"]),
        (("--model-control-mode=explicit", "--load-model=*"), "explicit", None),
        (("--load-model", "a", "--load-model", "b"), "explicit", ["a", "b"]),
        (("--model-control-mode", "poll"), "poll", None),
    ],
)
def test_explicit_mode_loads_only_the_load_model_ones_as_in_triton(argv, mode, loaded):
    settings = _settings(*argv)
    assert (settings.model_control_mode, settings.load_models) == (mode, loaded)
