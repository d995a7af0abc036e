"""What the e2e tests ask a running server (a model's statistics, one of its metrics), and
waiting until something they expect has happened."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server import Server


def stats(server: Server, model: str) -> dict:
    """``model``'s entry of ``GET /v2/models/{model}/stats``."""
    return httpx.get(f"{server.url}/v2/models/{model}/stats").json()["model_stats"][0]


def metric(server: Server, name: str, model: str) -> float:
    """The value of metric ``name`` labelled with ``model``, from the metrics port."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == name and sample.labels.get("model") == model:
                return sample.value
    raise AssertionError(f"no {name} for {model}")


def wait_for(
    condition: Callable[[], object], timeout: float = 30.0, what: str = "the condition"
) -> None:
    """Until ``condition()`` is true; fails the test, naming ``what``, after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
