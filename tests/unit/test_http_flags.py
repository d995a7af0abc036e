"""The slow-client flags: defaults, parsing, and where each server gets them."""

from __future__ import annotations

import pytest

from reposerve.cli import serve_parser, settings_from
from reposerve.http.connections import app_body_timeout, apply_hypercorn_limits
from reposerve.settings import Settings

pytestmark = pytest.mark.unit


def test_defaults_reach_settings():
    settings = settings_from(serve_parser().parse_args([]))
    assert settings.http_header_timeout_secs == 30.0
    assert settings.http_body_timeout_secs == 60.0
    assert settings.http_max_connections == 1024
    assert settings == Settings(metrics_port=8002, http_host="0.0.0.0")


@pytest.mark.parametrize(
    "argv",
    [
        ["--http-max-connections", "-1"],
        ["--http-max-connections", "1.5"],
        ["--http-header-timeout-secs", "-2"],
        ["--http-body-timeout-secs", "nan"],
    ],
)
def test_negative_or_malformed_values_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        serve_parser().parse_args(argv)
    assert ">= 0, got" in capsys.readouterr().err


class _HypercornConfig:
    keep_alive_timeout = 5.0


@pytest.mark.parametrize(("header", "expected"), [(30.0, 5.0), (1.0, 1.0), (0.0, 5.0)])
def test_hypercorn_head_deadline_is_its_keep_alive(header, expected):
    config = _HypercornConfig()
    apply_hypercorn_limits(config, Settings(http_header_timeout_secs=header))
    assert config.keep_alive_timeout == expected


def test_infer_endpoint_keeps_the_body_timeout_only_on_hypercorn():
    assert app_body_timeout(Settings()) is None  # uvicorn: the protocol keeps it
    assert app_body_timeout(Settings(http2=True)) == 60.0
    assert app_body_timeout(Settings(http_server="hypercorn", http_body_timeout_secs=2)) == 2
    assert app_body_timeout(Settings(http_server="hypercorn", http_body_timeout_secs=0)) is None
