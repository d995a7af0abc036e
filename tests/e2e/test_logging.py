"""Logging: Triton's --log-* flags, and the logging extension changing them at run time."""

from __future__ import annotations

import time

import httpx
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.server import running_server
from tests.toy_models import PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


@pytest.fixture
def models(repository):
    write_model(repository, "plus_one", vector_config(size=1), PLUS_ONE)
    return repository


def _wait_for(read, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in (log := read()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never logged:\n{log}")
        time.sleep(0.05)
    return log


def test_log_settings_change_at_run_time(models, tmp_path):
    with (
        running_server(models, tmp_path) as server,
        triton.InferenceServerClient(server.address) as client,
    ):
        assert client.get_log_settings() == DEFAULTS
        assert "logging" in client.get_server_metadata()["extensions"]
        # Verbose off: a reload logs no verbose line.
        client.load_model("plus_one")
        assert "loading plus_one (versions [1])" not in server.log()
        changed = client.update_log_settings({"log_verbose_level": 1})
        assert changed == dict(DEFAULTS, log_verbose_level=1)
        client.load_model("plus_one")
        _wait_for(server.log, "DEBUG reposerve.repository: loading plus_one (versions [1])")
        _wait_for(server.log, "DEBUG reposerve.http: POST /v2/repository/models/plus_one/load")
        # Errors off: a failed load no longer logs its error.
        client.update_log_settings({"log_error": False, "log_verbose_level": 0})
        size = len(server.log())
        with pytest.raises(InferenceServerException):
            client.load_model("no_such_model")
        client.update_log_settings({"log_info": True})  # logged: a marker after it
        log = _wait_for(server.log, "log settings changed: log_info=True")
        assert "no_such_model" not in log[size:]
        assert client.get_log_settings() == dict(DEFAULTS, log_error=False)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"log_file": "/tmp/elsewhere.log"}, "log settings: log_file can not be updated through "
         "the network protocol; restart the server with --log-file"),
        ({"log_verbose_level": -1}, "log settings: Expected `int` >= 0 - at `$.log_verbose_level`"),
        ({"log_info": "yes"}, "log settings: Expected `bool`, got `str` - at `$.log_info`"),
        ({"log_colour": True}, "log settings: Object contains unknown field `log_colour`"),
        ({"log_format": "xml"}, "log settings: Invalid enum value 'xml' - at `$.log_format` "
         "(expected one of default, ISO8601, json)"),
    ],
)  # fmt: skip
def test_bad_log_settings_are_400(bundled_server, body, error):
    response = httpx.post(f"{bundled_server.url}/v2/logging", json=body)
    assert response.status_code == 400
    assert response.json() == {"error": error}
    assert httpx.get(f"{bundled_server.url}/v2/logging").json()["log_file"] == ""


def test_logging_is_a_restricted_api(models, tmp_path):
    with running_server(
        models, tmp_path, "--http-restricted-api", "logging:admin-key=s3cret"
    ) as server:
        refused = httpx.post(f"{server.url}/v2/logging", json={"log_verbose_level": 1})
        assert refused.status_code == 403
        assert refused.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
        assert httpx.get(f"{server.url}/v2/logging").status_code == 403
        allowed = httpx.get(f"{server.url}/v2/logging", headers={"admin-key": "s3cret"})
        assert allowed.json() == DEFAULTS


def test_log_flags_at_start_up(models, tmp_path):
    log_file = tmp_path / "server.log"
    with running_server(
        models, tmp_path, "--log-file", str(log_file), "--log-verbose", "1",
        "--log-format", "ISO8601", "--log-warning", "false",
    ) as server:  # fmt: skip
        log = _wait_for(log_file.read_text, "ready: serving")
        assert "DEBUG reposerve.repository: loading plus_one" in log
        # ISO8601: UTC with a Z, as Triton writes it.
        assert log.splitlines()[0][:20].endswith("Z") and log[10] == "T"
        assert "ready: serving" not in server.log()  # the console has none of it
        settings = httpx.get(f"{server.url}/v2/logging").json()
        assert settings == dict(
            DEFAULTS, log_file=str(log_file), log_verbose_level=1, log_format="ISO8601",
            log_warning=False,
        )  # fmt: skip
