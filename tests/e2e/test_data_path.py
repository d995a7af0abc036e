"""The data path between the front and an instance: the next batch is staged in shared
memory while one runs, so the instance starts it without a round trip through the front."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.probes import metric, wait_for
from tests.server import running_server
from tests.toy_models import STAGING_PROBE, vector_body, vector_config, write_model

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("stage", "staged"), [("true", 1.0), ("false", 0.0)])
def test_the_next_batch_reaches_a_busy_instance_only_when_staging_is_on(
    repository, tmp_path, stage, staged
):
    config = vector_config(size=4, extra=f"[parameters]\nstage_next_batch = {stage}")
    folder = write_model(repository, "probe", config, STAGING_PROBE)
    with running_server(repository, tmp_path) as server:
        url = f"{server.url}/v2/models/probe/infer"
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(httpx.post, url, json=vector_body(1), timeout=60)
            wait_for((folder / "1" / "RUNNING").exists, what="the first batch to run")
            following = pool.submit(httpx.post, url, json=vector_body(2), timeout=60)
            wait_for(
                lambda: metric(server, "nv_inference_pending_request_count", "probe") == 1,
                what="the second request to be accepted",
            )
            time.sleep(0.1)  # time enough for a staged frame to cross the socket
            (folder / "1" / "GO").touch()
            first, second = running.result(), following.result()
        assert first.status_code == 200 and second.status_code == 200
        assert first.json()["outputs"][0]["data"] == [staged] * 4
        assert second.json()["outputs"][0]["data"] == [2.0, 1.0, 2.0, 3.0]
        assert metric(server, "nv_inference_pending_request_count", "probe") == 0
