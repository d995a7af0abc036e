"""On-demand loading and memory budgets through a real server: models load on their first
request, and idle ones are evicted least recently used first to stay within the budget;
busy and pinned ones never are, and a budget that cannot hold a model says so."""

from __future__ import annotations

import re
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.probes import wait_for
from tests.server import Server, running_server
from tests.toy_models import GATED, ensemble_head, vector_body, vector_config, write_model

pytestmark = pytest.mark.e2e

MIB = 1 << 20
# Each holds 60 MiB it has written (resident); with its interpreter about 90 MB of PSS.
HOLDS = """
    import numpy as np

    class Model:
        def load(self, context):
            self.weights = np.ones(60 << 20, np.uint8)

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 1}
"""
BUDGET = "200M"  # two such models, not three
FLAGS = ("--model-control-mode", "on-demand", "--host-memory-budget", BUDGET)


def _repository(root: Path, pinned: tuple[str, ...] = ()) -> Path:
    for name in ("a", "b", "c"):
        lifecycle = "[lifecycle]\npinned = true" if name in pinned else ""
        write_model(root, name, vector_config(size=4, extra=lifecycle), HOLDS)
    write_model(root, "gated", vector_config(size=4), GATED)
    return root


def _infer(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", json=vector_body(1.0), timeout=60)


def _index(url: str) -> dict[str, dict]:
    entries = httpx.post(f"{url}/v2/repository/index", json={}).json()
    return {entry["name"]: entry for entry in entries}


def _metric(server, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.MULTILINE)[1])


def test_first_requests_share_one_load_and_metadata_needs_none(tmp_path):
    with running_server(_repository(tmp_path / "repository"), tmp_path, *FLAGS) as server:
        assert _index(server.url)["a"].get("state") is None  # listed, not loaded
        config = httpx.get(f"{server.url}/v2/models/a/config").json()
        assert config["max_batch_size"] == 8  # answered from the folder
        assert httpx.get(f"{server.url}/v2/models/a/ready").status_code == 200
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: _infer(server.url, "a"), range(6)))
        assert [answer.status_code for answer in answers] == [200] * 6
        assert _metric(server, "reposerve_model_loads_total") == 1
        assert _index(server.url)["a"]["state"] == "READY"


def test_the_least_recently_used_idle_model_makes_room(tmp_path):
    with running_server(_repository(tmp_path / "repository"), tmp_path, *FLAGS) as server:
        for model in ("a", "b", "a"):  # b is now the least recently used
            assert _infer(server.url, model).status_code == 200
        assert _infer(server.url, "c").status_code == 200
        index = _index(server.url)
        assert index["a"]["state"] == "READY" and index["c"]["state"] == "READY"
        assert index["b"]["state"] == "UNAVAILABLE"
        assert re.fullmatch(r"evicted: least recently used, \d+ MiB for 'c'", index["b"]["reason"])
        assert _metric(server, "reposerve_model_evictions_total") == 1
        resident = _metric(server, 'reposerve_model_resident_bytes{model="a"}')
        assert 60 * MIB < resident < 200 * MIB
        assert _infer(server.url, "b").status_code == 200  # back on demand, evicting a
        assert _index(server.url)["a"]["reason"].endswith("for 'b'")


def test_a_model_with_a_request_in_progress_is_not_evicted(tmp_path):
    repository = _repository(tmp_path / "repository")
    folder = repository / "gated" / "1"
    with running_server(repository, tmp_path, *FLAGS) as server:
        assert _infer(server.url, "a").status_code == 200
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(_infer, server.url, "gated")  # loads, then holds its request
            wait_for((folder / "STARTED").exists, what="the gated request to start")
            # gated is the least recently used now, but busy: a makes room for b
            assert _infer(server.url, "b").status_code == 200
            assert _infer(server.url, "c").status_code == 200
            index = _index(server.url)
            assert index["gated"]["state"] == "READY"
            (folder / "GO").touch()
            assert held.result(timeout=60).status_code == 200


def test_pinned_models_stay_and_a_budget_that_cannot_fit_says_why(tmp_path):
    repository = _repository(tmp_path / "repository", pinned=("a", "b"))
    with running_server(repository, tmp_path, *FLAGS) as server:
        for model in ("a", "b"):
            assert _infer(server.url, model).status_code == 200
        for _ in range(2):  # measured once loaded, then known before it loads
            refused = _infer(server.url, "c")
            assert refused.status_code == 503
            error = refused.json()["error"]
            assert "which does not fit the host memory budget 200M" in error
            assert "held by " in error  # biggest first: a and b are the same size
            assert "'a' " in error and "'b' " in error and "(pinned)" in error
        index = _index(server.url)
        assert "does not fit the host memory budget" in index["c"]["reason"]
        assert index["a"]["state"] == index["b"]["state"] == "READY"


def test_a_budget_smaller_than_one_model_fails_its_load_with_the_reason(tmp_path):
    flags = ("--model-control-mode", "on-demand", "--host-memory-budget", "40M")
    with running_server(_repository(tmp_path / "repository"), tmp_path, *flags) as server:
        refused = _infer(server.url, "a")
        assert refused.status_code == 503, refused.text
        assert "does not fit the host memory budget 40M" in refused.json()["error"]
        assert _index(server.url)["a"]["state"] == "UNAVAILABLE"


def test_requests_keep_their_answers_while_models_come_and_go(tmp_path):
    """Every request sent to models churning through a budget of two gets its answer."""
    with running_server(_repository(tmp_path / "repository"), tmp_path, *FLAGS) as server:
        failures: list[str] = []
        lock = threading.Lock()

        def client(models: str) -> None:
            for model in models * 3:
                answer = _infer(server.url, model)
                if answer.status_code != 200:
                    with lock:
                        failures.append(f"{model}: {answer.status_code} {answer.text}")

        threads = [threading.Thread(target=client, args=(order,)) for order in ("abc", "cab")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert failures == []


def test_an_ensembles_steps_load_with_it_and_stay_while_it_does(tmp_path):
    repository = _repository(tmp_path / "repository")
    write_model(
        repository,
        "pipeline",
        ensemble_head(8)
        + '[[step]]\nmodel = "a"\ninput_map = { INPUT = "IN" }\noutput_map = { OUTPUT = "OUT" }',
        None,
    )
    body = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
    with running_server(repository, tmp_path, *FLAGS) as server:

        def pipeline() -> None:
            answer = httpx.post(f"{server.url}/v2/models/pipeline/infer", json=body, timeout=60)
            assert answer.status_code == 200, answer.text

        pipeline()
        assert _index(server.url)["a"]["state"] == "READY"  # loaded as its step
        assert _infer(server.url, "b").status_code == 200
        pipeline()  # b is now the least recently used
        assert _infer(server.url, "c").status_code == 200
        index = _index(server.url)
        assert index["a"]["state"] == "READY" and index["b"]["reason"].endswith("for 'c'")
        # the pipeline is the least recently used now: it goes, its step with it
        assert _infer(server.url, "b").status_code == 200
        index = _index(server.url)
        assert index["pipeline"]["reason"].endswith("for 'b'")
        assert index["a"]["state"] == "UNAVAILABLE" and index["c"]["state"] == "READY"
        pipeline()  # and both come back on demand


def test_a_budget_that_refuses_a_model_at_start_up_stops_the_server(tmp_path):
    repository = _repository(tmp_path / "repository")
    server = Server(repository, "--host-memory-budget", "40M", log_path=tmp_path / "log")
    try:
        assert server.process.wait(timeout=120) == 1
    finally:
        server.stop()
    log = server.log()
    assert "does not fit the host memory budget 40M" in log
    assert "failed to load (--exit-on-error true" in log


def test_a_model_the_poll_adds_makes_room_under_the_budget(tmp_path):
    repository = tmp_path / "repository"
    for name in ("a", "b"):
        write_model(repository, name, vector_config(size=4), HOLDS)
    flags = (
        "--model-control-mode", "poll", "--repository-poll-secs", "0.5",
        "--host-memory-budget", BUDGET,
    )  # fmt: skip
    with running_server(repository, tmp_path, *flags) as server:
        assert _infer(server.url, "b").status_code == 200  # a is the least recently used
        write_model(repository, "c", vector_config(size=4), HOLDS)
        wait_for(lambda: _index(server.url)["c"].get("state") == "READY", what="c to load")
        # measured once loaded, c takes the total over: a goes
        wait_for(lambda: _index(server.url)["a"]["state"] == "UNAVAILABLE", what="a to go")
        index = _index(server.url)
        assert index["a"]["reason"].endswith("for 'c'")
        assert index["b"]["state"] == "READY"


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB$", status, re.MULTILINE)[1]) << 10


def test_made_up_model_names_cost_nothing_past_their_request(tmp_path):
    """Every 404 for a name no repository holds leaves nothing behind: 8 KB names by the
    thousand (about 47 MiB of them) do not grow the server."""
    with running_server(_repository(tmp_path / "repository"), tmp_path, *FLAGS) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:

            def unknown(first: int, count: int) -> list[int]:
                return [
                    client.post(
                        f"/v2/models/{n:08d}{'x' * 8184}/infer", json=vector_body(1.0)
                    ).status_code
                    for n in range(first, first + count)
                ]

            assert unknown(0, 500) == [404] * 500  # the allocator settles
            before = _rss(server.process.pid)
            sent = 6000
            answers = unknown(500, sent)
            grown = _rss(server.process.pid) - before
        assert answers.count(404) == sent
        assert grown < 12 * MIB, f"{grown / MIB:.0f} MiB more after {sent} unknown names"


# Its load waits until GO appears beside model.py (a hung load, until the test lets it go).
LOAD_GATED = """
    import time

    class Model:
        def load(self, context):
            deadline = time.monotonic() + 100  # under --load-timeout-secs' 120
            while not (context.version_path / "GO").exists() and time.monotonic() < deadline:
                time.sleep(0.01)

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 1}
"""


def _state(url: str, model: str) -> str | None:
    return _index(url)[model].get("state")


def test_a_hung_load_holds_back_no_other_models_load(tmp_path):
    repository = _repository(tmp_path / "repository")
    write_model(repository, "hung", vector_config(size=4), LOAD_GATED)
    with running_server(repository, tmp_path, *FLAGS) as server, ThreadPoolExecutor(1) as pool:
        hung = pool.submit(_infer, server.url, "hung")
        wait_for(lambda: _state(server.url, "hung") == "LOADING", what="hung to load")
        assert _infer(server.url, "a").status_code == 200  # cold, loaded meanwhile
        assert _state(server.url, "hung") == "LOADING"
        (repository / "hung" / "1" / "GO").touch()
        assert hung.result(timeout=120).status_code == 200


def test_an_ensemble_and_its_steps_become_resident_as_one(tmp_path):
    """While an ensemble's second step loads, a cold model's load makes room: it evicts
    an idle model, never the first step (the least recently used) that the ensemble is
    about to need."""
    repository = _repository(tmp_path / "repository")
    write_model(repository, "second", vector_config(size=4), LOAD_GATED)
    steps = (
        '[[step]]\nmodel = "a"\ninput_map = { INPUT = "IN" }\noutput_map = { OUTPUT = "MID" }\n'
        '[[step]]\nmodel = "second"\ninput_map = { INPUT = "MID" }\noutput_map = { OUTPUT = "OUT" }'
    )
    write_model(repository, "pipeline", ensemble_head(8) + steps, None)
    body = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
    flags = ("--model-control-mode", "on-demand", "--host-memory-budget", "240M")
    with running_server(repository, tmp_path, *flags) as server:
        for model in ("a", "b"):  # a is the least recently used
            assert _infer(server.url, model).status_code == 200
        sent = 4
        with ThreadPoolExecutor(sent) as pool:
            answers = [
                pool.submit(
                    httpx.post, f"{server.url}/v2/models/pipeline/infer", json=body, timeout=120
                )
                for _ in range(sent)
            ]
            wait_for(lambda: _state(server.url, "second") == "LOADING", what="the second step")
            assert _infer(server.url, "c").status_code == 200  # a third of the budget's room
            (repository / "second" / "1" / "GO").touch()
            codes = [answer.result(timeout=120).status_code for answer in answers]
        assert codes == [200] * sent, [answer.result().text for answer in answers]
        index = _index(server.url)
        assert index["b"]["reason"].endswith("for 'c'")
        assert index["a"]["state"] == index["pipeline"]["state"] == "READY"


# Its load fails, after noting it in the file its parameters name.
FAILS_TO_LOAD = """
    from pathlib import Path

    class Model:
        def load(self, context):
            with Path(context.config.parameters["log"]).open("a") as log:
                log.write("load\\n")
            raise RuntimeError("the weights are missing")

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"]}
"""


def test_a_failed_load_is_remembered_until_its_files_change_or_it_is_loaded(tmp_path):
    repository = _repository(tmp_path / "repository")
    loads = tmp_path / "loads.log"
    config = vector_config(size=4, extra=f'[parameters]\nlog = "{loads}"')
    folder = write_model(repository, "broken", config, FAILS_TO_LOAD)
    flags = ("--model-control-mode", "on-demand")

    def count() -> int:
        return loads.read_text().count("load\n")

    def refused() -> None:
        answer = _infer(server.url, "broken")
        assert answer.status_code == 404, answer.text
        assert "RuntimeError: the weights are missing" in answer.json()["error"]

    with running_server(repository, tmp_path, *flags) as server:
        for _ in range(10):
            refused()
        assert count() == 1
        (folder / "1" / "model.py").write_text(textwrap.dedent(FAILS_TO_LOAD) + "\n# edited\n")
        # its files changed: tried once more (seen within a second: requests until then
        # answer the failure remembered)
        wait_for(lambda: refused() or count() == 2, 60, "a load from the changed files")
        for _ in range(3):
            refused()
        assert count() == 2
        answer = httpx.post(f"{server.url}/v2/repository/models/broken/load")
        assert answer.status_code == 400 and "weights are missing" in answer.text
        refused()
        assert count() == 3  # the operator's load is tried, whatever is remembered


def test_an_ensembles_request_waits_for_a_step_taken_from_under_it(tmp_path):
    """A step unloaded while an ensemble's request is on its way to it (an eviction does
    this when the ensemble comes back as its unit goes) is loaded again for that request,
    which waits for it: it never fails because its step went meanwhile."""
    repository = tmp_path / "repository"
    write_model(repository, "gated", vector_config(size=4), GATED)  # x * 2, once let go
    write_model(repository, "a", vector_config(size=4), HOLDS)  # x + 1
    steps = (
        '[[step]]\nmodel = "gated"\ninput_map = { INPUT = "IN" }\noutput_map = { OUTPUT = "MID" }\n'
        '[[step]]\nmodel = "a"\ninput_map = { INPUT = "MID" }\noutput_map = { OUTPUT = "OUT" }'
    )
    write_model(repository, "pipeline", ensemble_head(8) + steps, None)
    body = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
    flags = ("--model-control-mode", "on-demand")
    gate = repository / "gated" / "1"
    with running_server(repository, tmp_path, *flags) as server, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(
            httpx.post, f"{server.url}/v2/models/pipeline/infer", json=body, timeout=120
        )
        wait_for(lambda: (gate / "STARTED").exists(), 120, "the first step to start")
        unloaded = httpx.post(f"{server.url}/v2/repository/models/a/unload", timeout=60)
        assert unloaded.status_code == 200, unloaded.text
        assert _index(server.url)["a"]["state"] == "UNAVAILABLE"
        (gate / "GO").touch()
        reply = answer.result(timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [3.0] * 4
        assert _index(server.url)["a"]["state"] == "READY"  # loaded again for the request
