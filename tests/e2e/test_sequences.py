"""Sequence batching and request rescheduling, through a real server and Triton's clients:
the flows of Triton's sequence examples (sync HTTP and gRPC, gRPC streams) on the docs'
models, both strategies, implicit state, idle release, interleaved sequences under
concurrency, and python models that hand requests back."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.sequence_models import (
    ACCUMULATE_BASE,
    BLS_ACCUMULATE,
    BLS_ACCUMULATE_PBTXT,
    ENSEMBLE_ACCUMULATE,
    ITERATIVE,
    ITERATIVE_PBTXT,
    RESCHEDULE_AND_ANSWER,
    RESCHEDULE_ONCE,
    RESCHEDULE_PBTXT,
    write_accumulate,
    write_python_pbtxt,
    write_simple_dyna_sequence,
    write_simple_sequence,
    write_simple_string_dyna_sequence,
)
from tests.server import start_server
from tests.toy_models import write_model

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
pytestmark = pytest.mark.e2e

VALUES = [11, 7, 5, 3, 2, 0, 1]  # what Triton's examples send after the first value


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    write_simple_sequence(root)
    write_simple_sequence(root, "simple_sequence_auto", auto=True)
    write_simple_dyna_sequence(root)
    write_simple_string_dyna_sequence(root)
    write_accumulate(root)
    write_accumulate(
        root,
        "accumulate_oldest",
        strategy="oldest",
        strategy_settings="max_candidate_sequences = 8\nmax_queue_delay_microseconds = 20000",
    )
    write_accumulate(root, "accumulate_idle", idle_us=1_000_000)
    write_accumulate(root, "accumulate_fault")
    write_python_pbtxt(root, "bls_accumulate", BLS_ACCUMULATE_PBTXT, BLS_ACCUMULATE)
    write_model(root, "ensemble_accumulate", ENSEMBLE_ACCUMULATE, None)
    write_accumulate(
        root,
        "accumulate_one_slot",
        strategy="oldest",
        strategy_settings="max_candidate_sequences = 1",
    )
    write_python_pbtxt(root, "iterative", ITERATIVE_PBTXT, ITERATIVE)
    write_python_pbtxt(root, "reschedule_once", RESCHEDULE_PBTXT, RESCHEDULE_ONCE)
    write_python_pbtxt(root, "reschedule_and_answer", RESCHEDULE_PBTXT, RESCHEDULE_AND_ANSWER)
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def http(server):
    with httpclient.InferenceServerClient(server.address) as client:
        yield client


@pytest.fixture(scope="module")
def grpc(server):
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        yield client


def _int_input(module, value: int):
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
    return tensor


def _send(client, module, model, sequence_id, values) -> list[int]:
    """A sequence's values one by one, as Triton's sync examples send them."""
    results = []
    for index, value in enumerate(values):
        result = client.infer(
            model,
            [_int_input(module, value)],
            outputs=[module.InferRequestedOutput("OUTPUT")],
            sequence_id=sequence_id,
            sequence_start=index == 0,
            sequence_end=index == len(values) - 1,
        )
        results.append(int(result.as_numpy("OUTPUT")[0][0]))
    return results


def _expected(first: int, values: list[int], sign: int, dyna: bool, corrid: int) -> list[int]:
    """What the docs' models answer: the input, +1 on the first request, + the
    correlation id on the last (dyna)."""
    expected = [first + 1] + [sign * value for value in values]
    if dyna:
        expected[-1] += corrid
    return expected


def test_auto_complete_and_warmup_leave_the_controls_to_the_server(http):
    config = http.get_model_config("simple_sequence_auto")
    assert [t["name"] for t in config["input"]] == ["INPUT"]  # from the model file
    assert _send(http, httpclient, "simple_sequence_auto", 77, [5, 6]) == [6, 6]


@pytest.mark.parametrize("dyna", [False, True])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_sync_examples_flow(http, grpc, protocol, dyna):
    client, module = (http, httpclient) if protocol == "http" else (grpc, grpcclient)
    model = "simple_dyna_sequence" if dyna else "simple_sequence"
    offset = 10 if protocol == "grpc" else 0
    first, second = 1000 + offset, 1001 + offset
    assert _send(client, module, model, first, [0, *VALUES]) == _expected(0, VALUES, 1, dyna, first)
    assert _send(client, module, model, second, [100, *(-v for v in VALUES)]) == _expected(
        100, VALUES, -1, dyna, second
    )


def test_string_ids_and_implicit_state_on_a_python_model(http):
    key = "1002"
    results = _send(
        http, httpclient, "simple_string_dyna_sequence", key, [20, *(-v for v in VALUES)]
    )
    running = 20
    expected = [20]
    for value in VALUES:
        running -= value
        expected.append(running)
    expected[-1] += int(key)
    assert results == expected


def test_a_string_id_on_the_model_without_corrid(http):
    # simple_sequence has no CORRID control: any string identifies the sequence
    key = "0f6b6c1e-4d1e-4bb0-9a51-0d1f3c9a8e21"
    assert _send(http, httpclient, "simple_sequence", key, [20, -7, -5]) == [21, -7, -5]


def test_interleaved_sequences_on_one_grpc_stream_answer_in_order(grpc):
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        ids = {2000: 0, 2001: 100}
        for step, value in enumerate([0, *VALUES]):
            for key, first in ids.items():
                sent = first if step == 0 else (value if key == 2000 else -value)
                grpc.async_stream_infer(
                    "simple_dyna_sequence",
                    [_int_input(grpcclient, sent)],
                    request_id=f"{key}_{step}",
                    sequence_id=key,
                    sequence_start=step == 0,
                    sequence_end=step == len(VALUES),
                )
        results: dict[int, list[tuple[int, int]]] = {key: [] for key in ids}
        for _ in range(2 * (len(VALUES) + 1)):
            result, error = answers.get(timeout=30)
            assert error is None, error
            key, step = map(int, result.get_response().id.split("_"))
            results[key].append((step, int(result.as_numpy("OUTPUT")[0][0])))
    finally:
        grpc.stop_stream()
    for key, first in ids.items():
        sign = 1 if key == 2000 else -1
        assert [v for _, v in sorted(results[key])] == _expected(first, VALUES, sign, True, key)


def _accumulate(client, model, key, value, start=False, end=False):
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
    result = client.infer(model, [tensor], sequence_id=key, sequence_start=start, sequence_end=end)
    return float(result.as_numpy("SUM")[0][0]), int(result.as_numpy("PID")[0][0])


def _concurrent_sequences(server, model: str) -> None:
    steps = 15

    def run(key: int) -> tuple[list[float], set[int]]:
        sums, pids = [], set()
        # a client per thread: tritonclient.http's is not shared across threads
        with httpclient.InferenceServerClient(server.address) as client:
            for step in range(steps):
                total, pid = _accumulate(
                    client, model, key, key * 100.0 + step, start=step == 0, end=step == steps - 1
                )
                sums.append(total)
                pids.add(pid)
        return sums, pids

    keys = list(range(1, 9))
    with ThreadPoolExecutor(len(keys)) as pool:
        outcomes = dict(zip(keys, pool.map(run, keys), strict=True))
    for key, (sums, pids) in outcomes.items():
        assert sums == list(
            np.cumsum([ACCUMULATE_BASE] + [key * 100 + s for s in range(steps)])[1:]
        )
        assert len(pids) == 1  # the whole sequence ran on one instance


@pytest.mark.parametrize("model", ["accumulate", "accumulate_oldest"])
def test_concurrent_sequences_keep_their_state_order_and_instance(server, model):
    _concurrent_sequences(server, model)


def test_the_oldest_strategy_batches_across_sequences(server):
    def stats() -> dict[int, int]:
        with urllib.request.urlopen(f"{server.url}/v2/models/accumulate_oldest/stats") as answer:
            batches = json.load(answer)["model_stats"][0]["batch_stats"]
        return {batch["batch_size"]: int(batch["compute_infer"]["count"]) for batch in batches}

    before = stats()
    _concurrent_sequences(server, "accumulate_oldest")
    after = stats()
    grown = {size: after.get(size, 0) - before.get(size, 0) for size in after}
    assert any(size > 1 and count > 0 for size, count in grown.items()), grown


def test_a_state_starts_again_with_a_new_start(http):
    assert _accumulate(http, "accumulate", 77, 1.0, start=True)[0] == ACCUMULATE_BASE + 1
    assert _accumulate(http, "accumulate", 77, 2.0)[0] == ACCUMULATE_BASE + 3
    assert _accumulate(http, "accumulate", 77, 5.0, start=True)[0] == ACCUMULATE_BASE + 5
    assert _accumulate(http, "accumulate", 77, 1.0, end=True)[0] == ACCUMULATE_BASE + 6


def test_refusals_say_what_to_send(http):
    with pytest.raises(InferenceServerException) as caught:
        _accumulate(http, "accumulate", 0, 1.0, start=True)
    assert "must specify a non-zero or non-empty correlation ID" in caught.value.message()
    with pytest.raises(InferenceServerException) as caught:
        _accumulate(http, "accumulate", 4242, 1.0)
    assert caught.value.status() == "400"
    assert (
        "inference request for sequence 4242 to model 'accumulate' must specify the START flag"
        in caught.value.message()
    )
    # after END the sequence is gone: the next request must start it again
    _accumulate(http, "accumulate", 4243, 1.0, start=True, end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _accumulate(http, "accumulate", 4243, 1.0)
    with pytest.raises(InferenceServerException, match="correlation id 'abc' is a string"):
        _send(http, httpclient, "simple_dyna_sequence", "abc", [1])


def test_an_idle_sequence_is_released(http):
    _accumulate(http, "accumulate_idle", 9, 1.0, start=True)
    assert _accumulate(http, "accumulate_idle", 9, 1.0)[0] == ACCUMULATE_BASE + 2  # in time
    time.sleep(2.5)  # idle limit: 1 s
    with pytest.raises(
        InferenceServerException, match="must specify the START flag.*released after 1000000 us"
    ):
        _accumulate(http, "accumulate_idle", 9, 1.0)


def test_a_sequence_waits_for_a_free_slot(server, http):
    # one candidate per instance, two instances: a third sequence waits for one to end
    _accumulate(http, "accumulate_one_slot", 31, 1.0, start=True)
    _accumulate(http, "accumulate_one_slot", 32, 1.0, start=True)
    done = threading.Event()

    def third() -> None:
        with httpclient.InferenceServerClient(server.address) as client:
            _accumulate(client, "accumulate_one_slot", 33, 1.0, start=True, end=True)
        done.set()

    thread = threading.Thread(target=third)
    thread.start()
    assert not done.wait(0.5)  # in the backlog
    _accumulate(http, "accumulate_one_slot", 31, 1.0, end=True)
    assert done.wait(10)
    thread.join()
    _accumulate(http, "accumulate_one_slot", 32, 1.0, end=True)


def test_config_shows_the_sequence_batching_as_triton_does(http, grpc):
    config = http.get_model_config("simple_dyna_sequence")
    assert [t["name"] for t in config["input"]] == ["INPUT"]
    sequence = config["sequence_batching"]
    assert sequence["oldest"]["max_candidate_sequences"] == 1024
    assert [c["name"] for c in sequence["control_input"]] == ["START", "END", "READY", "CORRID"]
    parsed = grpc.get_model_config("simple_string_dyna_sequence").config
    assert parsed.sequence_batching.state[0].input_name == "ACC"
    assert [o.name for o in parsed.output] == ["OUTPUT"]  # the state is not an output


def test_a_rescheduled_request_runs_again_until_released(grpc):
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([4], np.int32))
        grpc.async_stream_infer("iterative", [tensor])
        values = []
        for _ in range(4):
            result, error = answers.get(timeout=30)
            assert error is None, error
            values.append(int(result.as_numpy("OUT")[0]))
    finally:
        grpc.stop_stream()
    assert values == [3, 2, 1, 0]


def test_a_request_handed_back_gets_the_later_answer(http):
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    result = http.infer("reschedule_once", [tensor])
    assert int(result.as_numpy("OUT")[0]) == 2  # answered in the second round


def test_a_request_both_handed_back_and_answered_fails_alone(http):
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as caught:
        http.infer("reschedule_and_answer", [tensor])
    assert "Expected a None object in the execute function return list" in caught.value.message()
    result = http.infer("reschedule_once", [tensor])  # the server goes on
    assert result.as_numpy("OUT") is not None


def test_an_instance_dying_costs_only_its_own_sequences(http):
    model = "accumulate_fault"
    _, doomed = _accumulate(http, model, 501, 1.0, start=True)
    _, spared = _accumulate(http, model, 502, 1.0, start=True)
    assert doomed != spared  # a new sequence goes to the instance holding fewest
    os.kill(doomed, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # its next request fails, once the server has seen the instance go
        with pytest.raises(InferenceServerException) as caught:
            _accumulate(http, model, 501, 1.0)
        if "sequence 501 was lost" in caught.value.message() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "start the sequence again" in caught.value.message()
    assert _accumulate(http, model, 502, 1.0)[0] == ACCUMULATE_BASE + 2  # its neighbour goes on
    while True:  # and the replacement takes the sequence started again
        try:
            total, pid = _accumulate(http, model, 501, 5.0, start=True)
            break
        except InferenceServerException:
            assert time.monotonic() < deadline, "the instance was not replaced"
            time.sleep(0.2)
    assert total == ACCUMULATE_BASE + 5 and pid != doomed


@pytest.mark.parametrize("caller", ["bls_accumulate", "ensemble_accumulate"])
def test_a_sequence_reaches_a_stateful_model_through_calls_and_ensembles(http, caller):
    key = 600 if caller.startswith("bls") else 601
    sums = [
        _sum(http, caller, key, value, start=index == 0, end=index == 2)
        for index, value in enumerate([1.0, 2.0, 3.0])
    ]
    assert sums == [ACCUMULATE_BASE + 1, ACCUMULATE_BASE + 3, ACCUMULATE_BASE + 6]


def _sum(client, model, key, value, start=False, end=False) -> float:
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
    result = client.infer(model, [tensor], sequence_id=key, sequence_start=start, sequence_end=end)
    return float(result.as_numpy("SUM")[0][0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_numeric_corrid_sees_one_sequence_per_id(http, grpc, protocol):
    client, module = (http, httpclient) if protocol == "http" else (grpc, grpcclient)
    key = 3000 if protocol == "http" else 3001

    def send(sequence_id, value, **flags) -> int:
        result = client.infer(
            "simple_dyna_sequence", [_int_input(module, value)], sequence_id=sequence_id, **flags
        )
        return int(result.as_numpy("OUTPUT")[0][0])

    # The model is told the id as a UINT64: the string of an integer is that integer's
    # sequence, and a second spelling of it is refused rather than made another sequence.
    assert send(str(key), 0, sequence_start=True) == 1
    for alias in (f"0{key}", f"+{key}"):
        with pytest.raises(InferenceServerException) as caught:
            send(alias, 0, sequence_start=True)
        assert f"correlation id '{alias}' is a string; its CORRID control is UINT64" in (
            caught.value.message()
        )
    assert send(key, 5, sequence_end=True) == 5 + key  # END * CORRID: the same sequence


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_long_string_id_is_refused_and_echoed_cut(server, http, grpc, protocol):
    client, module = (http, httpclient) if protocol == "http" else (grpc, grpcclient)
    key = "k" * (1 << 20)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(
            "simple_sequence", [_int_input(module, 1)], sequence_id=key, sequence_start=True
        )
    message = caught.value.message()
    assert (
        "model 'simple_sequence': parameter sequence_id is longer than the 256-byte limit of "
        f"a string correlation id (it begins '{'k' * 64}')"
    ) in message
    assert len(message) < 300
    longest = max(map(len, server.log().splitlines()))
    assert longest < 2000  # nothing logged the id whole
    # 256 bytes is accepted
    assert _send(client, module, "simple_sequence", "s" * 256, [20, -7]) == [21, -7]
