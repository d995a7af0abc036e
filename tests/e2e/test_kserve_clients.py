"""KServe's own clients against reposerve, unchanged: the `kserve` SDK's InferenceRESTClient
(protocol v2, JSON and binary tensors) and InferenceGRPCClient, the way an application in a
KServe cluster calls an InferenceService that runs on the reposerve runtime. They run in a
process of their own (tests/kserve_sdk.py), as such an application does."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.server import REPO_ROOT, Server

pytestmark = pytest.mark.e2e


def test_kserve_clients_read_health_and_infer(bundled_server: Server):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.kserve_sdk",
            "clients",
            bundled_server.address,
            bundled_server.grpc_address,
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    a = np.arange(3 * 16, dtype=np.int32).reshape(3, 16)
    expected = {"OUTPUT0": (a + 5).tolist(), "OUTPUT1": (a - 5).tolist()}
    for client, answers in (("rest", ("json", "binary")), ("grpc", ("binary",))):
        # the Open Inference Protocol's health bodies, read by KServe's clients
        assert seen[client]["live"] is seen[client]["ready"] is True, client
        assert seen[client]["model_ready"] is True, client
        for answer in answers:
            response = seen[client][answer]
            assert (response["model_name"], response["id"]) == ("add_sub", "kserve-1")
            assert response["outputs"] == expected, (client, answer)
    # our error reaches the application: the REST client puts the "error" text in its
    # message; gRPC carries it as the status details
    rest_error, grpc_error = seen["rest"]["error"], seen["grpc"]["error"]
    assert rest_error["status"] == 400 and grpc_error["status"] == "INVALID_ARGUMENT"
    for message in (rest_error["message"], grpc_error["message"]):
        assert "add_sub" in message and "INPUT0" in message and "FP32" in message, message
