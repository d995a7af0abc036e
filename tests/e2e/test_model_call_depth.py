"""A model that calls itself without end fails its client at once, naming the model and
how deep its calls went, instead of at the execution timeout: no instance is killed, no
request stays pending, and the call memfds the front holds stay flat across requests."""

from __future__ import annotations

import os

import httpx
import pytest

from tests.probes import metric
from tests.server import running_server
from tests.toy_models import write_model

pytestmark = pytest.mark.e2e

CONFIG = """
    max_batch_size = 0
    [[input]]
    name = "X"
    datatype = "FP32"
    shape = [4]
    [[output]]
    name = "Y"
    datatype = "FP32"
    shape = [4]
    [execution]
    timeout_seconds = 5
"""
FOREVER_SYNC = """
    class Model:
        def load(self, context):
            self.context = context

        def execute(self, inputs):
            return self.context.infer_sync(self.context.model_name, inputs)
"""
FOREVER_ASYNC = """
    class Model:
        def load(self, context):
            self.context = context

        async def execute(self, inputs):
            return await self.context.infer(self.context.model_name, dict(inputs))
"""
BODY = {"inputs": [{"name": "X", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def _call_memfds(pid: int) -> int:
    """The call slots (memfds of instances' callers) the front holds open."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += "reposerve-call-" in os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
    return count


@pytest.mark.parametrize("code", [FOREVER_SYNC, FOREVER_ASYNC], ids=["sync", "async"])
def test_a_model_calling_itself_without_end_fails_at_once_and_leaves_nothing(
    repository, tmp_path, code
):
    write_model(repository, "forever", CONFIG, code)
    with running_server(repository, tmp_path) as server:
        front = server.process.pid
        (instance,) = server.instance_pids()
        sent = 3
        with httpx.Client(base_url=server.url, timeout=60) as client:
            replies = [client.post("/v2/models/forever/infer", json=BODY)]
            held = _call_memfds(front)  # one slot per nested call, pooled for the next
            replies += [client.post("/v2/models/forever/infer", json=BODY) for _ in range(2)]
        assert [reply.status_code for reply in replies] == [500] * sent
        innermost = (
            "model 'forever' version 1: calling model 'forever': model calls nest 33 deep, "
            "beyond the limit of 32. Hint: a model that calls itself needs a case that "
            "ends the recursion"
        )
        for reply in replies:
            assert innermost in reply.json()["error"], reply.text
            assert "execution.timeout_seconds" not in reply.text
        # Nothing left running or waiting, and the instance was never killed.
        assert metric(server, "nv_inference_pending_request_count", "forever") == 0
        assert server.instance_pids() == [instance]
        assert _call_memfds(front) == held  # flat: the pooled slots served them all
