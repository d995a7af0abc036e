"""Poll mode: what changes on disk is loaded, reloaded or unloaded without a request."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from tests.server import start_server
from tests.toy_models import vector_config, write_model

pytestmark = pytest.mark.e2e

ADD = """
    class Model:
        def execute(self, inputs):
            return {{"OUTPUT": inputs["INPUT"] + {amount}}}
"""
BODY = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [0]}]}


def _eventually(check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (httpx.HTTPError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {check.__doc__}")
        time.sleep(0.1)


def test_poll_mode_follows_the_disk(repository, tmp_path):
    write_model(repository, "first", vector_config(size=1), ADD.format(amount=1))
    server = start_server(
        repository, tmp_path, "--model-control-mode", "poll", "--repository-poll-secs", "0.2"
    )
    url = server.url

    def answer(model: str) -> float | None:
        """the model answers"""
        response = httpx.post(f"{url}/v2/models/{model}/infer", json=BODY)
        return response.json()["outputs"][0]["data"][0] if response.status_code == 200 else None

    try:
        assert answer("first") == 1.0
        # A new folder is loaded.
        write_model(repository, "second", vector_config(size=1), ADD.format(amount=5))
        assert _eventually(lambda: answer("second")) == 5.0
        # A changed model is reloaded.
        time.sleep(0.05)  # a distinct modification time
        write_model(repository, "first", vector_config(size=1), ADD.format(amount=3))
        assert _eventually(lambda: answer("first") == 3.0)
        # A removed folder is unloaded.
        shutil.rmtree(repository / "second")
        assert _eventually(lambda: httpx.get(f"{url}/v2/models/second/ready").status_code == 400)
        # The control endpoints are off in poll mode, as in Triton.
        response = httpx.post(f"{url}/v2/repository/models/first/unload")
        assert response.status_code == 400
        assert "not allowed with --model-control-mode poll" in response.json()["error"]
    finally:
        assert server.stop() == 0, server.log()
