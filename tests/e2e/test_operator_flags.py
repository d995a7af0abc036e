"""Triton's operator flags: several repositories, auto-complete off, parallel loads."""

from __future__ import annotations

import shutil
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from tests.server import SERVE_BROKEN, Server, running_server
from tests.toy_models import PLUS_ONE, vector_config, write_model

pytestmark = pytest.mark.e2e


def _eventually(check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {check.__doc__}")
        time.sleep(0.1)
    return result


def _index(server) -> dict[str, dict]:
    response = httpx.post(f"{server.url}/v2/repository/index", json={})
    return {entry["name"]: entry for entry in response.json()}


def _plus_one(server, model: str) -> float:
    with triton.InferenceServerClient(server.address) as client:
        data = triton.InferInput("INPUT", [1, 1], "FP32")
        data.set_data_from_numpy(np.array([[1.0]], np.float32))
        return float(client.infer(model, [data]).as_numpy("OUTPUT")[0, 0])


def test_several_repositories_serve_as_one(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    write_model(first, "alpha", vector_config(size=1), PLUS_ONE)
    write_model(second, "beta", vector_config(size=1), PLUS_ONE)
    write_model(first, "twice", vector_config(size=1), PLUS_ONE)
    write_model(second, "twice", vector_config(size=1), PLUS_ONE)
    with running_server(
        first, tmp_path, "--model-repository", str(second), "--model-control-mode", "poll",
        "--repository-poll-secs", "0.2", *SERVE_BROKEN,
    ) as server:  # fmt: skip
        assert _plus_one(server, "alpha") == 2.0 and _plus_one(server, "beta") == 2.0
        entry = _index(server)["twice"]
        assert entry["state"] == "UNAVAILABLE"
        assert entry["reason"] == (
            f"twice: the model is in more than one repository ({first / 'twice'} and "
            f"{second / 'twice'}). Hint: rename or remove all but one; until then it does "
            "not load"
        )
        # Poll mode: once one copy goes, the other loads.
        shutil.rmtree(second / "twice")

        def loaded():
            """the remaining copy of 'twice' serves"""
            return _index(server)["twice"].get("state") == "READY"

        _eventually(loaded)
        assert _plus_one(server, "twice") == 2.0


def test_a_model_in_two_repositories_is_a_load_error_naming_both(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        write_model(root, "twice", vector_config(size=1), PLUS_ONE)
    with running_server(
        first, tmp_path, "--model-repository", str(second), *SERVE_BROKEN
    ) as server:
        response = httpx.post(f"{server.url}/v2/repository/models/twice/load")
        assert response.status_code == 400
        assert f"({first / 'twice'} and {second / 'twice'})" in response.json()["error"]
        missing = httpx.post(f"{server.url}/v2/repository/models/nowhere/load")
        assert missing.json()["error"] == f"nowhere: no such model folder in {first}, {second}"
        assert "nowhere" not in _index(server)


def test_check_reads_several_repositories_as_one(tmp_path, capsys):
    from reposerve.cli import check

    first, second = tmp_path / "first", tmp_path / "second"
    write_model(first, "alpha", vector_config(size=1), PLUS_ONE)
    for root in (first, second):
        write_model(root, "twice", vector_config(size=1), PLUS_ONE)
    assert check([str(first), str(second)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "ok   alpha (versions 1; python)",
        f"FAIL twice: the model is in more than one repository ({first / 'twice'} and "
        f"{second / 'twice'}). Hint: rename or remove all but one; until then it does not load",
    ]


def test_a_repository_given_twice_is_refused(tmp_path):
    from reposerve.cli import main

    assert main(["--model-repository", str(tmp_path), "--model-repository", str(tmp_path)]) == 2


ONNX_CONFIG = """
    max_batch_size = 4
"""


@pytest.mark.parametrize(
    "flags", [(), ("--disable-auto-complete-config",), ("--strict-model-config", "true")]
)
def test_auto_complete_off_needs_declared_tensors(tmp_path, flags):
    model_files = pytest.importorskip("tests.model_files")
    root = tmp_path / "repository"
    folder = write_model(root, "tiny", ONNX_CONFIG, None)
    model_files.export_onnx(folder / "1" / "model.onnx")
    declared = write_model(
        root,
        "tiny_declared",
        ONNX_CONFIG
        + """
        [[input]]
        name = "x"
        datatype = "FP32"
        shape = [4]
        [[output]]
        name = "y"
        datatype = "FP32"
        shape = [3]
        """,
        None,
    )
    model_files.export_onnx(declared / "1" / "model.onnx")
    with running_server(root, tmp_path, *flags, *SERVE_BROKEN) as server:
        index = _index(server)
        assert index["tiny_declared"]["state"] == "READY"
        if not flags:  # auto-complete on (Triton's default): the file fills them in
            assert index["tiny"]["state"] == "READY"
            return
        assert index["tiny"]["state"] == "UNAVAILABLE"
        assert index["tiny"]["reason"] == (
            "tiny: the config declares no [[input]] and [[output]], and auto-complete is off "
            "(--disable-auto-complete-config / --strict-model-config true). Hint: declare "
            "them, or let reposerve read them from the model file"
        )


# Each load writes "start NAME" then "end NAME" to a shared journal, and waits (up to a
# limit) for the other model's start first: loads that run at once both start before
# either ends; loads one at a time finish before the next begins.
JOURNALED = """
    import os
    import time
    from pathlib import Path

    JOURNAL = Path({journal!r})

    class Model:
        def load(self, context):
            name = context.version_path.parent.name
            with JOURNAL.open("a") as journal:
                journal.write(f"start {{name}}\\n")
            deadline = time.monotonic() + 3
            while JOURNAL.read_text().count("start") < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            with JOURNAL.open("a") as journal:
                journal.write(f"end {{name}}\\n")

        def execute(self, inputs):
            return {{"OUTPUT": inputs["INPUT"] + 1}}
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_model_load_thread_count_bounds_parallel_loads(tmp_path, threads):
    root = tmp_path / "repository"
    journal = tmp_path / "journal"
    for name in ("one", "two"):
        write_model(root, name, vector_config(size=1), JOURNALED.format(journal=str(journal)))
    with running_server(root, tmp_path, "--model-load-thread-count", str(threads)):
        events = [line.split()[0] for line in journal.read_text().splitlines()]
        if threads == 1:
            assert events == ["start", "end", "start", "end"]
        else:
            assert events == ["start", "start", "end", "end"]


WAITS_FOR_GO = """
    import time
    from pathlib import Path


    class Model:
        def load(self, context):
            go = Path({go!r})
            deadline = time.monotonic() + 60
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.02)

        def execute(self, inputs):
            return {{"OUTPUT": inputs["INPUT"] + 1}}
"""


def test_an_unload_during_start_up_is_no_failed_load(tmp_path):
    """--exit-on-error (on): a model unloaded on purpose while another still loads at
    start-up is not a load failure, and the server stays up."""
    root = tmp_path / "repository"
    go = tmp_path / "go"
    write_model(root, "fast", vector_config(size=1), PLUS_ONE)
    write_model(root, "slow", vector_config(size=1), WAITS_FOR_GO.format(go=str(go)))
    server = Server(root, log_path=tmp_path / "log")
    try:
        deadline = time.monotonic() + 60

        def state(name: str) -> str:
            try:
                entries = httpx.post(f"{server.url}/v2/repository/index", timeout=5).json()
            except httpx.TransportError:
                return ""
            return next((e.get("state", "") for e in entries if e["name"] == name), "")

        while state("fast") != "READY":
            assert server.process.poll() is None and time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        assert state("slow") != "READY"  # still loading
        unload = httpx.post(f"{server.url}/v2/repository/models/fast/unload", timeout=30)
        assert unload.status_code == 200, unload.text
        go.write_text("")
        server.wait_ready()
        assert server.process.poll() is None
        assert state("slow") == "READY" and state("fast") == "UNAVAILABLE"
    finally:
        assert server.stop() == 0, server.log()
