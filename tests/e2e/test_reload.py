"""Swapping a model version while it serves: the new one is loaded beside the old one and
takes over only when READY, so no request in flight or arriving meanwhile fails."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.server import running_server, start_server
from tests.toy_models import vector_config, write_model

pytestmark = pytest.mark.e2e

ADD = """
    import time

    class Model:
        def load(self, context):
            time.sleep(0.3)  # a load that takes a while, as real ones do

        def execute(self, inputs):
            time.sleep(0.005)
            return {{"OUTPUT": inputs["INPUT"] + {amount}}}
"""

BODY = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [0]}]}


def test_reload_under_load_drops_nothing(repository, tmp_path):
    write_model(repository, "adder", vector_config(size=1), ADD.format(amount=1))
    server = start_server(repository, tmp_path)
    seen: list[tuple[int, float]] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            while not stop.is_set():
                response = http.post("/v2/models/adder/infer", json=BODY)
                value = (
                    response.json()["outputs"][0]["data"][0] if response.status_code == 200 else -1
                )
                seen.append((response.status_code, value))

    threads = [threading.Thread(target=client) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        write_model(repository, "adder", vector_config(size=1), ADD.format(amount=2))
        response = httpx.post(f"{server.url}/v2/repository/models/adder/load", timeout=60)
        assert response.status_code == 200, response.text
        time.sleep(0.3)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        assert server.stop() == 0, server.log()
    statuses = {status for status, _ in seen}
    assert statuses == {200}, f"{len(seen)} requests, statuses {statuses}"
    values = [value for _, value in seen]
    assert values[0] == 1.0 and values[-1] == 2.0
    # Every answer came from one version or the other.
    assert set(values) == {1.0, 2.0}


def test_failed_reload_keeps_the_old_version_serving(repository, tmp_path):
    write_model(repository, "adder", vector_config(size=1), ADD.format(amount=1))
    with running_server(repository, tmp_path) as server:
        write_model(repository, "adder", vector_config(size=1), "raise ImportError('broken')\n")
        response = httpx.post(f"{server.url}/v2/repository/models/adder/load", timeout=60)
        assert response.status_code == 400
        assert "ImportError: broken (the previous one keeps serving)" in response.json()["error"]
        answer = httpx.post(f"{server.url}/v2/models/adder/infer", json=BODY).json()
        assert answer["outputs"][0]["data"] == [1.0]
