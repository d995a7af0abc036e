"""Decoupled (streaming) models over gRPC ModelStreamInfer and HTTP generate/_stream, with
tritonclient.grpc's stream API and raw HTTP: every response in order, errors per request,
a client that leaves stops its generation, a slow client holds it back."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import socket
import threading
import time
from functools import partial
from pathlib import Path

import httpx
import msgspec
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from reposerve.config import parse_model_config
from reposerve.instance.outcomes import BatchEvent, BatchFailure, BatchOutcome, BatchTensor
from reposerve.instance.process import InstanceProcess
from reposerve.instance.spec import InstanceSpec
from tests.server import Server, running_server, start_server
from tests.toy_models import COUNTING_ASYNC, COUNTING_SYNC, counting_config, write_model

pytestmark = pytest.mark.e2e

TEXT = "the quick brown fox jumps over the lazy dog"

X_TO_Y = """
[[input]]
name = "X"
datatype = "INT32"
shape = [1]
[[output]]
name = "Y"
datatype = "INT32"
shape = [1]
"""


@pytest.fixture(scope="module")
def streaming(tmp_path_factory: pytest.TempPathFactory):
    """A server with the counting models, sync and async, and their logs."""
    root = tmp_path_factory.mktemp("streaming")
    repository = root / "repository"
    logs = {}
    for name, code in (("count_sync", COUNTING_SYNC), ("count_async", COUNTING_ASYNC)):
        logs[name] = root / f"{name}.log"
        write_model(repository, name, counting_config(logs[name]), code)
    server = start_server(repository, root)
    yield server, logs
    assert server.stop() == 0, server.log()


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _events(lines) -> list[dict]:
    return [msgspec.json.decode(line[len("data: ") :]) for line in lines if line]


def _text_inputs(text: str, delay_ms: int) -> list[grpcclient.InferInput]:
    words = grpcclient.InferInput("text_input", [1], "BYTES")
    words.set_data_from_numpy(np.array([text.encode()], dtype=object))
    delay = grpcclient.InferInput("delay_ms", [1], "INT32")
    delay.set_data_from_numpy(np.array([delay_ms], dtype=np.int32))
    return [words, delay]


def _count_inputs(count: int, delay: float, size: int = 1) -> list[grpcclient.InferInput]:
    tensors = []
    for name, datatype, value in (
        ("COUNT", "INT32", np.array([count], np.int32)),
        ("DELAY", "FP32", np.array([delay], np.float32)),
        ("SIZE", "INT32", np.array([size], np.int32)),
    ):
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


class StreamResults:
    """What a tritonclient stream's callback received, by request id, in order."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()

    def callback(self, result, error) -> None:
        self.queue.put((result, error))

    def take(self, count: int, timeout: float = 20.0) -> list:
        return [self.queue.get(timeout=timeout) for _ in range(count)]


def test_grpc_stream_receives_every_response_of_each_request_in_order(bundled_server):
    words = TEXT.split()
    client = grpcclient.InferenceServerClient(bundled_server.grpc_address)
    results = StreamResults()
    client.start_stream(callback=results.callback)
    try:
        for index in range(4):
            client.async_stream_infer(
                "text_stream",
                _text_inputs(TEXT, 5),
                request_id=f"r{index}",
                enable_empty_final_response=True,
            )
        received = results.take(4 * (len(words) + 1))
    finally:
        client.stop_stream()
    by_request: dict[str, list] = {f"r{index}": [] for index in range(4)}
    for result, error in received:
        assert error is None, error
        response = result.get_response()
        by_request[response.id].append(
            (
                response.parameters["triton_final_response"].bool_param,
                result.as_numpy("text_output"),
                result.as_numpy("index"),
            )
        )
    for responses in by_request.values():
        *tokens, last = responses
        assert last == (True, None, None)  # the empty final response that was asked for
        assert [final for final, _, _ in tokens] == [False] * len(words)
        assert [int(index[0]) for _, _, index in tokens] == list(range(len(words)))
        assert b"".join(text[0] for _, text, _ in tokens).decode() == TEXT


def test_grpc_stream_answers_every_request_and_errors_cost_only_their_own(bundled_server):
    client = grpcclient.InferenceServerClient(bundled_server.grpc_address)
    results = StreamResults()
    client.start_stream(callback=results.callback)
    ones = np.ones((1, 16), np.float32)
    try:
        client.async_stream_infer("text_stream", _text_inputs("a b c", 20), request_id="text")
        client.async_stream_infer("no_such_model", _text_inputs("a", 0), request_id="unknown")
        wrong = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        wrong.set_data_from_numpy(ones)
        client.async_stream_infer("add_sub", [wrong, wrong], request_id="wrong")
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
            inputs.append(tensor)
        client.async_stream_infer("add_sub", inputs, request_id="sum")
        received = results.take(6)
    finally:
        client.stop_stream()
    errors = sorted(str(error) for _, error in received if error is not None)
    assert len(errors) == 2
    assert "Request for unknown model: 'no_such_model' is not found" in errors[0]
    assert "model 'add_sub': input 'INPUT0'" in errors[1]
    answered = {}
    for result, error in received:
        if error is None:
            response = result.get_response()
            answered.setdefault(response.id, []).append(result)
    assert len(answered["text"]) == 3
    (sum_result,) = answered["sum"]
    # A model that answers once: its one response is final.
    assert sum_result.get_response().parameters["triton_final_response"].bool_param
    assert sum_result.as_numpy("OUTPUT0").tolist() == [list(range(0, 32, 2))]


def test_unary_calls_refuse_a_decoupled_model_with_what_to_call_instead(bundled_server):
    client = grpcclient.InferenceServerClient(bundled_server.grpc_address)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("text_stream", _text_inputs("a b", 0))
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "decoupled" in caught.value.message() and "ModelStreamInfer" in caught.value.message()
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}
    reply = httpx.post(f"{bundled_server.url}/v2/models/text_stream/infer", json=body)
    assert reply.status_code == 501
    assert "generate_stream" in reply.json()["error"]
    config = client.get_model_config("text_stream", as_json=True)["config"]
    assert config["model_transaction_policy"] == {"decoupled": True}


def test_generate_stream_sends_one_event_per_response_as_each_is_made(bundled_server):
    url = f"{bundled_server.url}/v2/models/text_stream/generate_stream"
    arrivals = []
    started = time.monotonic()
    with httpx.stream("POST", url, json={"text_input": "one two three", "delay_ms": 300}) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = []
        for line in reply.iter_lines():
            if line:
                arrivals.append(time.monotonic() - started)
            lines.append(line)
    events = _events(lines)
    assert [event["text_output"] for event in events] == ["one ", "two ", "three"]
    assert events[0] == {
        "model_name": "text_stream",
        "model_version": "1",
        "text_output": "one ",
        "index": 0,
    }
    # Streamed, not gathered: the first came long before the last was made.
    assert arrivals[-1] - arrivals[0] > 0.45


def test_generate_answers_json_for_a_model_that_answers_once(bundled_server):
    body = {"INPUT0": list(range(16)), "INPUT1": [1] * 16, "id": "g1"}
    reply = httpx.post(f"{bundled_server.url}/v2/models/add_sub/generate", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "id": "g1",
        "model_name": "add_sub",
        "model_version": "1",
        "OUTPUT0": [value + 1 for value in range(16)],
        "OUTPUT1": [value - 1 for value in range(16)],
    }
    one = httpx.post(
        f"{bundled_server.url}/v2/models/text_stream/generate", json={"text_input": "single"}
    )
    assert one.json()["text_output"] == "single"
    several = httpx.post(
        f"{bundled_server.url}/v2/models/text_stream/generate", json={"text_input": "two words"}
    )
    assert several.status_code == 400
    assert "more than one response" in several.json()["error"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[1, 2]", "a generate request is a JSON object"),
        ("{", "malformed generate request JSON"),
        ('{"INPUT0": [1, 2], "INPUT1": [1, 2]}', "input 'INPUT0': 2 values do not fill"),
        ('{"INPUT0": [[1]], "INPUT1": [1]}', "a scalar or a flat array"),
        ('{"extra": {"nested": 1}}', "'extra' is not an input of the model"),
        ('{"parameters": 3}', "parameters must be a JSON object"),
        ('{"id": 5}', "id must be a string"),
        ('{"INPUT1": ' + str(list(range(16))) + "}", "missing"),
    ],
)
def test_a_bad_generate_request_is_a_400_naming_the_problem(bundled_server, body, message):
    for path in ("generate", "generate_stream"):
        reply = httpx.post(
            f"{bundled_server.url}/v2/models/add_sub/{path}",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert reply.status_code == 400, reply.text
        assert message in reply.json()["error"]
        assert "add_sub" in reply.json()["error"]


@pytest.mark.parametrize("model", ["count_sync", "count_async"])
def test_an_sse_client_that_disconnects_stops_its_generation(streaming, model):
    server, logs = streaming
    log = logs[model]
    log.unlink(missing_ok=True)
    url = f"{server.url}/v2/models/{model}/generate_stream"
    with httpx.stream("POST", url, json={"COUNT": 1000, "DELAY": 0.02, "SIZE": 1}) as reply:
        lines = reply.iter_lines()
        seen = [line for _, line in zip(range(6), lines, strict=False)]
    assert len(_events(seen)) == 3  # three events (and their blank lines) read, then gone
    assert _wait_for(lambda: "cancelled" in _lines(log)), _lines(log)
    produced = _lines(log).count("yield")
    time.sleep(0.3)
    assert _lines(log).count("yield") == produced < 50  # it stopped, long before 1000


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_a_client_that_leaves_before_the_first_response_stops_the_generation(streaming, path):
    """The first response is 3 s away when the client gives up: the model is cancelled
    then, not when that response would have been sent."""
    server, logs = streaming
    log = logs["count_async"]
    log.unlink(missing_ok=True)
    url = f"{server.url}/v2/models/count_async/{path}"
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json={"COUNT": 5, "DELAY": 3.0, "SIZE": 1}, timeout=0.5)
    assert _wait_for(lambda: "cancelled" in _lines(log), timeout=1.5), _lines(log)
    assert "yield" not in _lines(log)


@pytest.mark.parametrize("model", ["count_sync", "count_async"])
def test_a_grpc_client_that_cancels_its_stream_stops_the_generation(streaming, model):
    server, logs = streaming
    log = logs[model]
    log.unlink(missing_ok=True)
    client = grpcclient.InferenceServerClient(server.grpc_address)
    results = StreamResults()
    client.start_stream(callback=results.callback)
    client.async_stream_infer(model, _count_inputs(1000, 0.02), request_id="long")
    assert all(error is None for _, error in results.take(3))
    client.stop_stream(cancel_requests=True)
    assert _wait_for(lambda: "cancelled" in _lines(log)), _lines(log)
    assert _lines(log).count("yield") < 50


@pytest.mark.parametrize("model", ["count_sync", "count_async"])
def test_a_client_that_stops_reading_holds_its_generation_back(streaming, model):
    """Responses of 1 MiB to a client that reads nothing: the model is held after the few
    the socket buffers and the stream hold, instead of buffering all 400 in the server."""
    server, logs = streaming
    log = logs[model]
    log.unlink(missing_ok=True)
    body = msgspec.json.encode({"COUNT": 400, "DELAY": 0.0, "SIZE": 1 << 20})
    head = (
        f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nhost: x\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    reader.connect(("127.0.0.1", server.port))
    reader.sendall(head + body)
    try:
        assert _wait_for(lambda: _lines(log).count("yield") >= 3)
        time.sleep(1.5)
        held = _lines(log).count("yield")
        # A few 1 MiB events fill the socket buffers and the stream; without backpressure
        # all 400 are made and encoded in well under a second.
        assert held < 40, held
    finally:
        reader.close()
    assert _wait_for(lambda: "cancelled" in _lines(log)), _lines(log)


def test_a_model_failing_mid_stream_ends_that_stream_with_its_error_only(streaming):
    server, _ = streaming
    url = f"{server.url}/v2/models/count_async/generate_stream"
    outcomes: dict[str, list[dict]] = {}

    def call(name: str, size: int) -> None:
        with httpx.stream("POST", url, json={"COUNT": 6, "DELAY": 0.01, "SIZE": size}) as reply:
            outcomes[name] = _events(reply.iter_lines())

    threads = [
        threading.Thread(target=call, args=("failing", 3)),
        *(threading.Thread(target=call, args=(f"fine{index}", 1)) for index in range(3)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    failing = outcomes["failing"]
    assert [event.get("OUT") for event in failing[:3]] == [0, 1, 2]
    assert "fails after three responses" in failing[3]["error"]
    assert "count_async" in failing[3]["error"] and len(failing) == 4
    for index in range(3):
        assert [event["OUT"] for event in outcomes[f"fine{index}"]] == list(range(6))


def test_batched_requests_each_get_their_own_rows_of_every_response(repository, tmp_path):
    """With dynamic batching, requests in one batch step together: every yield answers
    each of them with its rows."""
    write_model(
        repository,
        "batched_stream",
        "max_batch_size = 8\n"
        + X_TO_Y
        + "[dynamic_batching]\nmax_queue_delay_microseconds = 200000\npreferred_batch_size = [4]",
        """
        import numpy as np

        class Model:
            def execute(self, inputs):
                for step in range(3):
                    yield {"Y": inputs["X"] * 10 + step}
        """,
    )
    with running_server(repository, tmp_path) as server:
        client = grpcclient.InferenceServerClient(server.grpc_address)
        results = StreamResults()
        client.start_stream(callback=results.callback)
        for value in range(4):
            tensor = grpcclient.InferInput("X", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], np.int32))
            client.async_stream_infer("batched_stream", [tensor], request_id=str(value))
        received = results.take(12)
        client.stop_stream()
        by_request: dict[str, list[int]] = {}
        for result, error in received:
            assert error is None, error
            by_request.setdefault(result.get_response().id, []).append(
                int(result.as_numpy("Y")[0][0])
            )
        assert by_request == {str(v): [v * 10, v * 10 + 1, v * 10 + 2] for v in range(4)}
        stats = httpx.get(f"{server.url}/v2/models/batched_stream/stats").json()
        (batch,) = stats["model_stats"][0]["batch_stats"]
        assert batch["batch_size"] == 4  # the four went as one batch


def test_decoupled_needs_a_generator_and_a_generator_is_decoupled(repository, tmp_path):
    one_vector = X_TO_Y
    write_model(
        repository,
        "says_decoupled",
        "decoupled = true\n" + one_vector,
        "class Model:\n    def execute(self, inputs):\n        return {'Y': inputs['X']}\n",
    )
    write_model(
        repository,
        "yields",
        one_vector,
        "class Model:\n    def execute(self, inputs):\n        yield {'Y': inputs['X']}\n",
    )
    server = Server(
        repository, "--exit-on-error", "false", "--strict-readiness", "false",
        log_path=tmp_path / "server.log",
    )  # fmt: skip
    try:
        server.wait_ready()
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        reasons = {entry["name"]: entry.get("reason", "") for entry in index}
        assert (
            "says decoupled (model_transaction_policy), but the model answers once"
            in (reasons["says_decoupled"])
        )
        config = httpx.get(f"{server.url}/v2/models/yields/config").json()
        assert config["model_transaction_policy"] == {"decoupled": True}
    finally:
        server.stop()


def _outcome_into(ended: dict[int, object], index: int, event: BatchEvent) -> None:
    if isinstance(event, BatchOutcome | BatchFailure):
        ended[index] = event


def test_batches_cancelled_before_they_begin_on_an_async_instance_still_end(tmp_path):
    """A Cancel that reaches an async instance before its batch's task has run: the batch
    still ends with an outcome (a task cancelled before it starts would never answer)."""
    write_model(tmp_path, "agen", counting_config(tmp_path / "agen.log"), COUNTING_ASYNC)
    config = parse_model_config((tmp_path / "agen" / "config.toml").read_text(), "agen")
    spec = InstanceSpec(
        model="agen", version=1, version_path=str(tmp_path / "agen" / "1"), backend="python",
        config_json=msgspec.json.encode(config), index=0, kind="cpu", gpu=None, cpus=(),
        threads=1, execute_timeout_s=0,
    )  # fmt: skip

    async def body() -> tuple[dict[int, object], int]:
        instance = InstanceProcess(spec, lambda _: None)
        await instance.start(60)
        ended: dict[int, object] = {}
        try:
            for index in range(10):
                inputs = [
                    BatchTensor(name, datatype, (1,), [np.array([value], dtype).tobytes()])
                    for name, datatype, dtype, value in (
                        ("COUNT", "INT32", np.int32, 100),
                        ("DELAY", "FP32", np.float32, 0.05),
                        ("SIZE", "INT32", np.int32, 1),
                    )
                ]
                # Its responses are never resumed: only the outcome counts here.
                batch = instance.run(inputs, partial(_outcome_into, ended, index))
                instance.cancel(batch)  # in the same turn: before the instance runs it
            deadline = time.monotonic() + 10
            while len(ended) < 10 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return ended, instance.in_flight
        finally:
            await instance.stop(5)

    ended, in_flight = asyncio.run(body())
    assert len(ended) == 10 and in_flight == 0
    assert all(isinstance(outcome, BatchOutcome) for outcome in ended.values())


def test_an_instance_killed_mid_stream_ends_each_of_its_streams_with_the_reason(
    repository, tmp_path
):
    """Three streams on one async instance, SIGKILLed after their first responses: each
    gets exactly its error as the last event; the replacement serves the next stream."""
    log = tmp_path / "count.log"
    write_model(repository, "count_async", counting_config(log), COUNTING_ASYNC)
    with running_server(repository, tmp_path) as server:
        (pid,) = server.instance_pids()
        url = f"{server.url}/v2/models/count_async/generate_stream"
        outcomes: dict[int, list[dict]] = {}
        started = threading.Barrier(4)

        def stream(index: int) -> None:
            body = {"COUNT": 1000, "DELAY": 0.02, "SIZE": 1}
            with httpx.stream("POST", url, json=body, timeout=30) as reply:
                events = []
                for line in reply.iter_lines():
                    if not line:
                        continue
                    events.append(msgspec.json.decode(line[len("data: ") :]))
                    if len(events) == 2:
                        started.wait(timeout=20)
                outcomes[index] = events

        threads = [threading.Thread(target=stream, args=(index,)) for index in range(3)]
        for thread in threads:
            thread.start()
        started.wait(timeout=20)
        os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join(30)
        assert sorted(outcomes) == [0, 1, 2]
        for events in outcomes.values():
            *responses, last = events
            assert [event["OUT"] for event in responses] == list(range(len(responses)))
            assert "killed by SIGKILL" in last["error"] and "count_async" in last["error"]
        ready = f"{server.url}/v2/models/count_async/ready"
        assert _wait_for(lambda: httpx.get(ready).status_code == 200, timeout=20)
        assert server.instance_pids() != [pid]
        with httpx.stream("POST", url, json={"COUNT": 3, "DELAY": 0.0, "SIZE": 1}) as reply:
            assert [event["OUT"] for event in _events(reply.iter_lines())] == [0, 1, 2]


def test_an_unload_waits_for_running_streams_to_finish(repository, tmp_path):
    log = tmp_path / "count.log"
    write_model(repository, "count_sync", counting_config(log), COUNTING_SYNC)
    with running_server(repository, tmp_path) as server:
        url = f"{server.url}/v2/models/count_sync/generate_stream"
        received: list[dict] = []

        def stream() -> None:
            body = {"COUNT": 20, "DELAY": 0.05, "SIZE": 1}
            with httpx.stream("POST", url, json=body, timeout=30) as reply:
                received.extend(_events(reply.iter_lines()))

        thread = threading.Thread(target=stream)
        thread.start()
        assert _wait_for(lambda: _lines(log).count("yield") >= 3)
        unloaded = httpx.post(f"{server.url}/v2/repository/models/count_sync/unload", timeout=30)
        assert unloaded.status_code == 200
        thread.join(30)
        assert [event["OUT"] for event in received] == list(range(20))  # nothing cut short
        ready = httpx.get(f"{server.url}/v2/models/count_sync/ready")
        assert ready.status_code == 400
