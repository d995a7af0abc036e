"""The instance process alone: a real worker running a tiny python model, driven frame by
frame from the test's end of its socket pair, as the front would drive it (Load, AddSlot
with the slot's memfd, Execute, Resume, Cancel, Shutdown), no front and no HTTP."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from reposerve.framing import FrameReader
from reposerve.instance.arena import Slot
from reposerve.instance.messages import (
    AddSlot,
    Cancel,
    Execute,
    Failure,
    FromInstance,
    Load,
    LoadFailed,
    Ready,
    Response,
    Result,
    Resume,
    Shutdown,
    TensorRef,
    ToInstance,
    encode_frame,
)
from reposerve.instance.spawn import spawn
from reposerve.instance.spec import InstanceSpec
from tests.toy_models import (
    COUNTING_ASYNC,
    COUNTING_SYNC,
    PICKY,
    counting_config,
    vector_config,
)

pytestmark = pytest.mark.integration

TIMEOUT_S = 60  # for any one frame; a test that passes waits for events, never this


class Worker:
    """One instance process and the front's end of its socket: frames out, frames in,
    slots whose memfds go beside AddSlot frames."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.sock, child = socket.socketpair()
        self.process = spawn(spec, child.fileno())
        child.close()
        self.sock.settimeout(TIMEOUT_S)
        self._reader = FrameReader(FromInstance)
        self._frames: deque[FromInstance] = deque()
        self.slots: dict[int, Slot] = {}
        load = Load(spec.model, 1, spec.version_path, "python", spec.config_json, 0, "cpu", 1)
        self.send(load)

    def send(self, message: ToInstance) -> None:
        self.sock.sendall(encode_frame(message))

    def add_slot(self, index: int) -> Slot:
        slot = self.slots[index] = Slot.create(f"test-worker-{index}")
        socket.send_fds(self.sock, [encode_frame(AddSlot(index, slot.size))], [slot.fd])
        return slot

    def execute(self, batch_id: int, slot_index: int, **inputs: np.ndarray) -> None:
        """Write ``inputs`` into the slot one after another and send the batch."""
        slot = self.slots.get(slot_index) or self.add_slot(slot_index)
        refs, offset = [], 0
        for name, array in inputs.items():
            datatype = {"float32": "FP32", "int32": "INT32"}[array.dtype.name]
            refs.append(TensorRef(name, datatype, array.shape, offset, array.nbytes))
            slot.buffer[offset : offset + array.nbytes] = array.tobytes()
            offset += 64 * (array.nbytes // 64 + 1)
        self.send(Execute(batch_id, slot_index, slot.size, refs))

    def receive(self) -> FromInstance:
        """The next frame the process sends; an error if it closed its end instead."""
        while not self._frames:
            data = self.sock.recv(1 << 16)
            assert data, f"the worker closed its socket (exit code {self.process.poll()})"
            self._frames.extend(self._reader.feed(data))
        return self._frames.popleft()

    def output(self, slot_index: int, ref: TensorRef, dtype: type) -> np.ndarray:
        slot = self.slots[slot_index]
        buffer = slot.buffer[ref.offset : ref.offset + ref.nbytes]
        return np.frombuffer(buffer, dtype).reshape(ref.shape)

    def close(self) -> int:
        """Shut the process down as the front does; its exit code."""
        with contextlib.suppress(OSError):  # gone already
            self.send(Shutdown())
        try:
            return self.process.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        finally:
            self.sock.close()
            for slot in self.slots.values():
                slot.close()


@pytest.fixture
def start(python_model: Callable[..., InstanceSpec]):
    workers: list[Worker] = []

    def start(code: str, config: str) -> Worker:
        workers.append(Worker(python_model(code, config)))
        return workers[-1]

    yield start
    for worker in workers:
        worker.close()


def _rows(*firsts: float) -> np.ndarray:
    """A batch of FP32[4] items, item i starting with firsts[i] (PICKY reads it)."""
    batch = np.arange(len(firsts) * 4, dtype=np.float32).reshape(len(firsts), 4)
    batch[:, 0] = firsts
    return batch


def test_a_sync_model_says_how_it_runs_and_answers_in_its_slot(start):
    worker = start(PICKY, vector_config(size=4))
    ready = worker.receive()
    assert isinstance(ready, Ready)
    # One batch at a time, one more staged to start the moment it answers.
    assert (ready.max_inflight, ready.staging, ready.per_request) == (1, 1, False)
    worker.execute(0, 0, INPUT=_rows(1, 2))
    worker.execute(1, 1, INPUT=_rows(5))  # staged behind batch 0
    for batch_id, slot_index, firsts in ((0, 0, (1, 2)), (1, 1, (5,))):
        result = worker.receive()
        assert isinstance(result, Result) and result.batch_id == batch_id
        (ref,) = result.outputs
        assert ref.name == "OUTPUT" and ref.offset > 0  # after the inputs
        np.testing.assert_array_equal(
            worker.output(slot_index, ref, np.float32), _rows(*firsts) + 1
        )
    assert worker.close() == 0


def test_a_failing_batch_fails_alone_and_says_whose_fault_it_is(start):
    worker = start(PICKY, vector_config(size=4))
    assert isinstance(worker.receive(), Ready)
    worker.execute(0, 0, INPUT=_rows(-1))
    assert worker.receive() == Failure(
        0, "an item starts with -1, which this model cannot read", invalid_input=True
    )
    worker.execute(1, 0, INPUT=_rows(-2))
    assert worker.receive() == Failure(1, "ValueError: an item starts with -2", invalid_input=False)
    worker.execute(2, 0, INPUT=_rows(7))
    result = worker.receive()
    assert isinstance(result, Result) and result.batch_id == 2


def test_outputs_that_break_the_config_fail_the_batch(start):
    wrong_shape = """
        class Model:
            def execute(self, inputs):
                return {"OUTPUT": inputs["INPUT"][:, :3]}
    """
    worker = start(wrong_shape, vector_config(size=4))
    assert isinstance(worker.receive(), Ready)
    worker.execute(0, 0, INPUT=_rows(1))
    assert worker.receive() == Failure(
        0, "output 'OUTPUT': expected item shape [4], got [3]", invalid_input=False
    )


def test_a_model_that_cannot_load_says_why_and_exits(start):
    worker = start("class Model:\n    pass\n", vector_config(size=4))
    failed = worker.receive()
    assert isinstance(failed, LoadFailed)
    assert failed.reason.endswith("class Model has no execute(self, inputs) method")
    assert worker.process.wait(TIMEOUT_S) == 1


def test_shutdown_unloads_the_model_and_ends_the_process(start, tmp_path):
    unloads = """
        from pathlib import Path

        class Model:
            def load(self, context):
                self.marker = Path(context.config.parameters["marker"])

            def execute(self, inputs):
                return {"OUTPUT": inputs["INPUT"]}

            def unload(self):
                self.marker.write_text("unloaded")
    """
    marker = tmp_path / "marker"
    worker = start(unloads, vector_config(size=4, extra=f'[parameters]\nmarker = "{marker}"'))
    assert isinstance(worker.receive(), Ready)
    assert worker.close() == 0
    assert marker.read_text() == "unloaded"


def test_an_async_model_runs_its_batches_at_once(start):
    # Batch 0 waits for batch 1 to begin: only an instance that runs both at once answers.
    waits_for_the_other = """
        import asyncio

        class Model:
            def load(self, context):
                self.second = asyncio.Event()

            async def execute(self, inputs):
                if inputs["INPUT"][0, 0] == 0:
                    await self.second.wait()
                else:
                    self.second.set()
                return {"OUTPUT": inputs["INPUT"]}
    """
    worker = start(waits_for_the_other, vector_config(size=4))
    ready = worker.receive()
    assert isinstance(ready, Ready) and ready.max_inflight > 1 and ready.staging == 0
    worker.execute(0, 0, INPUT=_rows(0))
    worker.execute(1, 1, INPUT=_rows(1))
    answered = [worker.receive(), worker.receive()]
    assert [type(frame) for frame in answered] == [Result, Result]
    assert [frame.batch_id for frame in answered] == [1, 0]  # type: ignore[union-attr]


COUNTING = {"sync": COUNTING_SYNC, "async": COUNTING_ASYNC}


@pytest.fixture(params=sorted(COUNTING))
def counting(request: pytest.FixtureRequest, start, tmp_path: Path) -> tuple[Worker, Path]:
    """A decoupled model, sync or async, and the log of what it yielded and how it ended."""
    log = tmp_path / "count.log"
    worker = start(COUNTING[request.param], counting_config(log))
    ready = worker.receive()
    assert isinstance(ready, Ready) and ready.staging == 0  # nothing waits behind a stream
    return worker, log


def _count(worker: Worker, batch_id: int, count: int, size: int = 1) -> None:
    inputs = {"COUNT": count, "DELAY": 0.0, "SIZE": size}
    dtypes = {"COUNT": np.int32, "DELAY": np.float32, "SIZE": np.int32}
    worker.execute(
        batch_id, 0, **{name: np.array([value], dtypes[name]) for name, value in inputs.items()}
    )


def _out(worker: Worker, response: Response) -> int:
    (ref,) = [ref for ref in response.outputs if ref.name == "OUT"]
    return int(worker.output(0, ref, np.int32)[0])


def test_a_stream_writes_each_next_response_only_once_resumed(counting):
    worker, _ = counting
    _count(worker, 0, 4)
    values = []
    for index in range(4):
        response = worker.receive()
        assert isinstance(response, Response) and response.batch_id == 0
        values.append(_out(worker, response))
        if index < 3:
            worker.send(Resume(0))
    result = worker.receive()
    assert isinstance(result, Result) and result.batch_id == 0 and result.outputs == []
    assert values == [0, 1, 2, 3]


def test_a_stream_not_resumed_runs_at_most_one_ahead_and_a_cancel_stops_the_model(counting):
    worker, log = counting
    _count(worker, 0, 1000)
    first = worker.receive()
    assert isinstance(first, Response) and _out(worker, first) == 0
    worker.send(Cancel(0))  # no Resume: the model may produce the next one, never send it
    result = worker.receive()
    assert isinstance(result, Result) and result.batch_id == 0
    # An async model may be stopped where it awaits, before it yields the next one.
    assert log.read_text().split() in (["yield", "yield", "cancelled"], ["yield", "cancelled"])
    # The instance serves the next stream.
    _count(worker, 1, 1)
    response = worker.receive()
    assert isinstance(response, Response) and response.batch_id == 1
    assert isinstance(worker.receive(), Result)


def test_a_stream_that_raises_ends_with_its_failure_after_its_responses(counting):
    worker, _ = counting
    _count(worker, 0, 6, size=3)
    for index in range(3):
        response = worker.receive()
        assert isinstance(response, Response) and _out(worker, response) == index
        worker.send(Resume(0))
    assert worker.receive() == Failure(
        0, "ValueError: fails after three responses", invalid_input=False
    )


RESHAPED_CONFIG = """
    [[input]]
    name = "COUNT"
    datatype = "INT32"
    shape = [1]
    [[output]]
    name = "OUT"
    datatype = "INT32"
    shape = [2]
    reshape = [1, 2]
"""

# Yields OUT in its reshaped form [1, 2], COUNT times; clients see it as [2].
RESHAPED = {
    "sync": """
        import numpy as np

        class Model:
            def execute(self, inputs):
                for index in range(int(inputs["COUNT"][0])):
                    yield {"OUT": np.full([1, 2], index, np.int32)}
    """,
    "async": """
        import numpy as np

        class Model:
            async def execute(self, inputs):
                for index in range(int(inputs["COUNT"][0])):
                    yield {"OUT": np.full([1, 2], index, np.int32)}
    """,
}


@pytest.mark.parametrize("kind", sorted(RESHAPED))
def test_a_reshaped_stream_comes_out_in_the_client_s_shape(start, kind):
    worker = start(RESHAPED[kind], RESHAPED_CONFIG)
    assert isinstance(worker.receive(), Ready)
    worker.execute(0, 0, COUNT=np.array([2], np.int32))
    for index in range(2):
        response = worker.receive()
        assert isinstance(response, Response)
        (ref,) = response.outputs
        assert ref.shape == (2,)
        assert worker.output(0, ref, np.int32).tolist() == [index, index]
        worker.send(Resume(0))
    assert isinstance(worker.receive(), Result)
