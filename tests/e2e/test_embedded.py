"""``reposerve.Server``, the server in this Python process: real instance processes,
numpy in and out, calls from threads and event loops batching together, a decoupled
model's stream, the control operations, and its errors in the command's words."""

from __future__ import annotations

import asyncio
import gc
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import reposerve
from reposerve.errors import EmbeddedError, ProtocolError, RepositoryError
from tests.toy_models import (
    COUNTING_SYNC,
    PLUS_ONE,
    counting_config,
    vector_config,
    write_model,
)

pytestmark = pytest.mark.e2e

BATCHING = "[dynamic_batching]\nmax_queue_delay_microseconds = 20000"


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repository"
    write_model(root, "plus_one", vector_config(size=4, extra=BATCHING), PLUS_ONE)
    write_model(root, "counting", counting_config(tmp_path / "counting.log"), COUNTING_SYNC)
    return root


@pytest.fixture
def server(repository):
    with reposerve.Server(repository) as running:
        yield running


def _rows(count: int, first: float = 0.0) -> np.ndarray:
    return (np.arange(count * 4, dtype=np.float32) + first).reshape(count, 4)


def test_a_call_answers_with_arrays_of_its_own(server):
    first = server.infer("plus_one", {"INPUT": _rows(2)})
    assert first.model_name == "plus_one" and first.model_version == "1" and first.final
    np.testing.assert_array_equal(first.outputs["OUTPUT"], _rows(2) + 1)
    for _ in range(20):  # the batch memory its outputs came from is used again meanwhile
        server.infer("plus_one", {"INPUT": _rows(2, first=100)})
    np.testing.assert_array_equal(first.outputs["OUTPUT"], _rows(2) + 1)
    named = server.infer(
        "plus_one", {"INPUT": _rows(1)}, version="1", outputs=["OUTPUT"], request_id="r-7"
    )
    assert named.id == "r-7" and list(named.outputs) == ["OUTPUT"]
    with pytest.raises(RepositoryError, match="version 9"):
        server.infer("plus_one", {"INPUT": _rows(1)}, version="9")
    assert server.ready() and server.ready("plus_one")
    assert [entry.name for entry in server.models(ready=True)] == ["counting", "plus_one"]


def test_calls_from_threads_and_an_event_loop_batch_together(server):
    def one(value: float) -> np.ndarray:
        return server.infer("plus_one", {"INPUT": _rows(1, first=value)}).outputs["OUTPUT"]

    async def gathered() -> list[reposerve.InferResult]:
        calls = (server.infer_async("plus_one", {"INPUT": _rows(1, first=n)}) for n in range(16))
        return await asyncio.gather(*calls)

    results: dict[int, np.ndarray] = {}
    threads = [
        threading.Thread(target=lambda n=n: results.__setitem__(n, one(1000 * n))) for n in range(8)
    ]
    for thread in threads:
        thread.start()
    answered = asyncio.run(gathered())
    for thread in threads:
        thread.join(60)
    for n in range(16):
        np.testing.assert_array_equal(answered[n].outputs["OUTPUT"], _rows(1, first=n) + 1)
    for n in range(8):
        np.testing.assert_array_equal(results[n], _rows(1, first=1000 * n) + 1)
    (stats,) = server.statistics("plus_one").model_stats
    assert stats.inference_count == 24
    assert stats.execution_count < 24  # they met in batches, as clients' requests do


def test_a_decoupled_models_responses_stream_and_leaving_early_cancels_it(server, tmp_path):
    inputs = {
        "COUNT": np.array([4], np.int32),
        "DELAY": np.array([0.0], np.float32),
        "SIZE": np.array([2], np.int32),
    }
    results = list(server.stream("counting", inputs))
    assert [int(r.outputs["OUT"][0]) for r in results] == [0, 1, 2, 3]
    assert results[0].outputs["BLOB"].tolist() == [b"xx"]

    async def first_of_many() -> int:
        many = {
            **inputs,
            "COUNT": np.array([1000], np.int32),
            "DELAY": np.array([0.01], np.float32),
        }
        async for result in server.stream_async("counting", many):
            return int(result.outputs["OUT"][0])  # leaves the stream: the request is cancelled
        return -1

    assert asyncio.run(first_of_many()) == 0
    log = tmp_path / "counting.log"
    deadline = 60.0
    while "cancelled" not in log.read_text() and deadline > 0:  # hang detector, generous
        deadline -= 0.05
        threading.Event().wait(0.05)
    assert "cancelled" in log.read_text()


def test_bad_calls_get_the_protocols_errors_and_harm_nothing(server):
    with pytest.raises(ProtocolError, match="unknown input 'NOPE'"):
        server.infer("plus_one", {"NOPE": _rows(1)})
    with pytest.raises(ProtocolError, match="expected datatype FP32, got FP64"):
        server.infer("plus_one", {"INPUT": _rows(1).astype(np.float64)})
    with pytest.raises(RepositoryError, match="missing"):
        server.infer("missing", {"INPUT": _rows(1)})
    with pytest.raises(EmbeddedError, match="no V2 datatype"):
        server.infer("plus_one", {"INPUT": np.ones((1, 4), np.complex64)})
    with pytest.raises(EmbeddedError, match="outputs: a list of output names"):
        server.infer("plus_one", {"INPUT": _rows(1)}, outputs="OUTPUT")
    with pytest.raises(EmbeddedError, match="input 'TEXT': BYTES elements must be bytes or str"):
        server.infer("plus_one", {"TEXT": np.array([None, 1], dtype=object)})
    assert server.infer("plus_one", {"INPUT": _rows(1)}, version=1).model_version == "1"
    assert server.ready("plus_one", 1) and server.metadata("plus_one", 1).versions == ["1"]
    np.testing.assert_array_equal(
        server.infer("plus_one", {"INPUT": _rows(1)}).outputs["OUTPUT"], _rows(1) + 1
    )


def test_explicit_mode_loads_and_unloads_and_other_modes_refuse_it(repository):
    with reposerve.Server(repository, load_model=["counting"]) as server:
        assert [entry.name for entry in server.models(ready=True)] == ["counting"]
        server.load("plus_one")
        assert server.ready("plus_one")
        assert server.infer("plus_one", {"INPUT": _rows(1)}).outputs["OUTPUT"][0, 0] == 1
        config = server.config("plus_one")
        assert config["max_batch_size"] == 8
        server.unload("plus_one")
        assert not server.ready("plus_one")
    with reposerve.Server(repository, model_control_mode="none") as server:
        with pytest.raises(RepositoryError, match="not allowed with --model-control-mode none"):
            server.unload("plus_one")
        assert server.ready("plus_one")


def test_options_are_the_commands_flags_checked_as_its_own(repository):
    with pytest.raises(EmbeddedError, match="unknown option 'no_such_thing'"):
        reposerve.Server(repository, no_such_thing=1)
    with pytest.raises(EmbeddedError, match="invalid choice: 'sometimes'"):
        reposerve.Server(repository, model_control_mode="sometimes")
    with pytest.raises(EmbeddedError, match="first argument"):
        reposerve.Server(repository, model_repository="elsewhere")
    with pytest.raises(EmbeddedError, match="allow_http: an embedded server opens no HTTP"):
        reposerve.Server(repository, allow_http=True)
    with pytest.raises(EmbeddedError, match="log_file: an embedded server logs through"):
        reposerve.Server(repository, log_file="server.log")
    with pytest.raises(EmbeddedError, match="exit_timeout_secs: invalid float value"):
        reposerve.Server(repository, exit_timeout_secs="soon")
    odd = reposerve.Server(repository, server_name="-dash", load_model={"plus_one"})
    assert odd.settings.server_name == "-dash" and odd.settings.load_models == ["plus_one"]
    assert reposerve.Server(repository, exit_timeout_secs=None).settings.exit_timeout_secs == 30
    server = reposerve.Server(repository, model_control_mode="explicit", load_model=["plus_one"])
    assert server.settings.load_models == ["plus_one"]
    assert server.settings.http_port is None and server.settings.grpc_port is None
    in_a_bucket = reposerve.Server(["s3://127.0.0.1:9000/bucket/models", repository])
    (remote,) = in_a_bucket.settings.remote_repositories  # a URL stays a URL
    assert (remote.bucket, remote.prefix) == ("bucket", "models")


def test_calls_out_of_its_lifetime_say_so(repository):
    server = reposerve.Server(repository)
    with pytest.raises(EmbeddedError, match="not started"):
        server.models()
    server.start()
    server.stop()
    with pytest.raises(EmbeddedError, match="has stopped"):
        server.infer("plus_one", {"INPUT": _rows(1)})
    with pytest.raises(EmbeddedError, match="started already"):
        server.start()
    server.stop()  # again: harmless


def test_a_start_that_fails_says_which_model_and_why(tmp_path):
    root = tmp_path / "repository"
    write_model(root, "broken", vector_config(size=4), "raise RuntimeError('no weights here')")
    with pytest.raises(EmbeddedError, match="broken: .*no weights here"):
        reposerve.Server(root, exit_on_error=True).start()
    with reposerve.Server(root, exit_on_error=False) as server:  # it serves what loaded
        (entry,) = server.models()
        assert entry.state == "UNAVAILABLE" and "no weights here" in entry.reason


STARTED_THEN_SLOW = """
    import time
    from pathlib import Path

    class Model:
        def load(self, context):
            self.mark = Path(context.config.parameters["mark"])

        def execute(self, inputs):
            self.mark.write_text("started")
            time.sleep(0.5)
            return {"OUTPUT": inputs["INPUT"] * 2}
"""


def test_a_request_under_way_at_stop_gets_its_answer(tmp_path):
    root, mark = tmp_path / "repository", tmp_path / "started"
    config = vector_config(size=4, extra=f'[parameters]\nmark = "{mark}"')
    write_model(root, "slow", config, STARTED_THEN_SLOW)
    server = reposerve.Server(root).start()
    answers: list[np.ndarray] = []
    caller = threading.Thread(
        target=lambda: answers.append(server.infer("slow", {"INPUT": _rows(1)}).outputs["OUTPUT"])
    )
    caller.start()
    waited = 0.0
    while not mark.exists() and waited < 60:  # hang detector, generous
        waited += threading.Event().wait(0.02) or 0.02
    server.stop()
    caller.join(60)
    (answer,) = answers  # answered before its model stopped
    np.testing.assert_array_equal(answer, _rows(1) * 2)


def test_grpc_clients_reach_an_embedded_server(repository):
    import tritonclient.grpc as grpcclient

    from tools.bench.servers import free_port

    port = free_port()
    with reposerve.Server(repository, allow_grpc=True, grpc_port=port) as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        tensor = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        tensor.set_data_from_numpy(_rows(1))
        result = client.infer("plus_one", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), _rows(1) + 1)
        assert server.statistics("plus_one").model_stats[0].inference_count == 1
        client.close()


def test_importing_reposerve_stays_light():
    """A model's ``import reposerve`` (for InvalidInput) loads no server."""
    code = "import sys, reposerve; print('reposerve.embedded' in sys.modules, reposerve.Server)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.startswith("False <class 'reposerve.embedded.server.Server'>")


def test_the_docs_example_runs_on_the_bundled_repository():
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "embedded.md").read_text()
    example = re.findall(r"```python\n(.*?)```", page, re.S)[0]  # the page's first
    done = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, cwd=root, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("add_sub 1 [[")


SLOW_LOAD = """
    import time

    class Model:
        def load(self, context):
            time.sleep(60)

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"]}
"""


def test_a_stop_leaves_no_caller_waiting(tmp_path):
    """A load that outlasts the exit budget: its caller gets an error, not a hang."""
    root = tmp_path / "repository"
    write_model(root, "slow_load", vector_config(size=4), SLOW_LOAD)
    write_model(root, "plus_one", vector_config(size=4), PLUS_ONE)
    server = reposerve.Server(root, load_model=["plus_one"], exit_timeout_secs=1).start()
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            server.load("slow_load")
            outcome.append(None)
        except BaseException as exc:  # what the caller sees is the point
            outcome.append(exc)

    caller = threading.Thread(target=load)
    caller.start()
    threading.Event().wait(0.5)  # the load under way
    server.stop()
    caller.join(60)
    assert not caller.is_alive()
    (error,) = outcome
    assert isinstance(error, reposerve.ReposerveError)
    assert not [t for t in threading.enumerate() if t.name == "reposerve"]


def test_a_stream_under_way_at_stop_runs_to_its_end(server):
    inputs = {
        "COUNT": np.array([20], np.int32),
        "DELAY": np.array([0.02], np.float32),
        "SIZE": np.array([1], np.int32),
    }
    seen: list[int] = []
    started = threading.Event()

    def read() -> None:
        for result in server.stream("counting", inputs):
            seen.append(int(result.outputs["OUT"][0]))
            started.set()

    reader = threading.Thread(target=read)
    reader.start()
    started.wait(60)
    server.stop()
    reader.join(60)
    assert seen == list(range(20))


def test_a_failed_start_leaves_nothing_running(repository):
    from tools.bench.servers import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        options = {"allow_grpc": True, "grpc_port": busy, "grpc_address": "127.0.0.1"}
        metrics = {"allow_metrics": True, "metrics_port": free_port()}
        with pytest.raises(OSError):
            reposerve.Server(repository, **options, **metrics).start()
    ours = {"reposerve", "usage-sampler"}  # the loop's thread, the metrics' sampler
    assert not [thread for thread in threading.enumerate() if thread.name in ours]


def test_a_server_dropped_without_stop_stops(repository):
    server = reposerve.Server(repository).start()
    assert server.ready()
    del server
    gc.collect()
    assert not [t for t in threading.enumerate() if t.name == "reposerve"]


def test_a_server_running_at_interpreter_exit_stops_cleanly(repository):
    """A script that never calls stop(): its server stops at exit while thread pools still
    take work (an instance's exit is awaited in one), so nothing is reported and no
    instance process outlives it."""
    script = (
        "import os, numpy, reposerve\n"
        "from tools.bench.servers import children_of\n"
        f"server = reposerve.Server({str(repository)!r}).start()\n"
        "print(server.infer('plus_one', {'INPUT': numpy.zeros((1, 4), 'float32')})"
        ".outputs['OUTPUT'][0, 0])\n"
        "print(*children_of(os.getpid()))\n"
    )
    checkout = Path(__file__).parents[2]  # where tools.bench is
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=checkout
    )
    assert done.returncode == 0, done.stderr
    answer, children = done.stdout.splitlines()
    assert answer == "1.0" and children  # its instance processes, while it ran
    assert "Traceback" not in done.stderr and "never retrieved" not in done.stderr, done.stderr
    for pid in children.split():
        assert not Path(f"/proc/{pid}").exists(), f"instance process {pid} outlived its host"


def test_every_call_under_way_at_stop_gets_exactly_one_outcome(repository):
    """32 calls in flight from one event loop when stop() comes: each ends once, with its
    result or the server's error, and none is left waiting."""
    server = reposerve.Server(repository).start()
    outcomes: list[object] = []

    async def calls() -> None:
        async def one(value: float) -> None:
            try:
                result = await server.infer_async("plus_one", {"INPUT": _rows(1, first=value)})
                outcomes.append(result.outputs["OUTPUT"][0, 0] - value)
            except reposerve.ReposerveError as exc:
                outcomes.append(type(exc).__name__)

        tasks = [asyncio.ensure_future(one(float(n))) for n in range(32)]
        await asyncio.sleep(0)  # sent
        await asyncio.to_thread(server.stop)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)

    asyncio.run(calls())
    assert len(outcomes) == 32
    assert all(outcome == 1 or isinstance(outcome, str) for outcome in outcomes), outcomes
