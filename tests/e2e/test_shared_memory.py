"""Triton's system shared-memory extension through tritonclient, HTTP and gRPC, as Triton's
shm examples use it: regions registered, tensors read from and written into them, status
and unregister; then the bounds, the lifetimes (a request in flight, a file unlinked or
cut short) and the registrations a hostile client sends."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from tests.client_shared_memory import Regions, shm
from tests.probes import metric, wait_for
from tests.server import REPO_ROOT, running_server, start_server
from tests.toy_models import GATED, SIMPLE_STRING, SIMPLE_STRING_CONFIG, vector_config, write_model

pytestmark = pytest.mark.e2e

SHM = Path("/dev/shm")
INT32 = 16 * 4  # bytes of one INT32 [1, 16] tensor


def _repository(root: Path) -> Path:
    shutil.copytree(REPO_ROOT / "model_repository" / "add_sub", root / "simple")
    write_model(root, "simple_string", SIMPLE_STRING_CONFIG, SIMPLE_STRING)
    write_model(root, "gated", vector_config(size=4), GATED)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = _repository(tmp_path_factory.mktemp("repository"))
    server = start_server(root, tmp_path_factory.mktemp("log"), "--allow-client-shm", "true")
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def http(server):
    client = httpclient.InferenceServerClient(server.address)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_address)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def regions():
    made = Regions()
    yield made
    made.close()


def _file(key: str) -> Path:
    return SHM / key.lstrip("/")


def _error(call) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.message()


def _status_code(call) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status()


def _add_sub_regions(client, regions: Regions, a: np.ndarray, b: np.ndarray):
    """Triton's simple_*_shm_client layout: INPUT0 and INPUT1 one after the other in
    'input_data', OUTPUT0 and OUTPUT1 likewise in 'output_data'."""
    inputs, in_key = regions.create("input_data", 2 * INT32)
    outputs, out_key = regions.create("output_data", 2 * INT32)
    shm.set_shared_memory_region(inputs, [a])
    shm.set_shared_memory_region(inputs, [b], offset=INT32)
    client.register_system_shared_memory("input_data", in_key, 2 * INT32)
    client.register_system_shared_memory("output_data", out_key, 2 * INT32)
    return outputs, in_key, out_key


def _in_regions(module) -> tuple[list, list]:
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory("input_data", INT32)
    inputs[1].set_shared_memory("input_data", INT32, offset=INT32)
    outputs = [module.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
    outputs[0].set_shared_memory("output_data", INT32)
    outputs[1].set_shared_memory("output_data", INT32, offset=INT32)
    return inputs, outputs


def test_add_sub_in_shared_memory_over_http(http, regions):
    a, b = np.arange(16, dtype=np.int32), np.full(16, 3, dtype=np.int32)
    out, in_key, out_key = _add_sub_regions(http, regions, a, b)
    inputs, outputs = _in_regions(httpclient)
    result = http.infer("simple", inputs, outputs=outputs).get_response()
    # Metadata alone, as Triton answers: no data, no binary part and no parameters (which
    # Triton's C++ client reads as a binary output's).
    assert result["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16]},
    ]
    total = shm.get_contents_as_numpy(out, np.int32, [1, 16])
    difference = shm.get_contents_as_numpy(out, np.int32, [1, 16], offset=INT32)
    np.testing.assert_array_equal(total[0], a + b)
    np.testing.assert_array_equal(difference[0], a - b)
    assert http.get_system_shared_memory_status() == [
        {"name": "input_data", "key": in_key, "offset": 0, "byte_size": 128},
        {"name": "output_data", "key": out_key, "offset": 0, "byte_size": 128},
    ]
    assert http.get_system_shared_memory_status("output_data") == [
        {"name": "output_data", "key": out_key, "offset": 0, "byte_size": 128}
    ]
    http.unregister_system_shared_memory("input_data")
    assert [region["name"] for region in http.get_system_shared_memory_status()] == ["output_data"]
    http.unregister_system_shared_memory()
    assert http.get_system_shared_memory_status() == []


def test_add_sub_in_shared_memory_over_grpc(grpc, regions):
    a, b = np.arange(16, dtype=np.int32), np.full(16, 3, dtype=np.int32)
    out, in_key, _ = _add_sub_regions(grpc, regions, a, b)
    inputs, outputs = _in_regions(grpcclient)
    response = grpc.infer("simple", inputs, outputs=outputs).get_response()
    # One raw_output_contents per output, empty for each in shared memory, and no output
    # parameters (Triton's).
    assert list(response.raw_output_contents) == [b"", b""]
    assert [(output.name, list(output.shape)) for output in response.outputs] == [
        ("OUTPUT0", [1, 16]), ("OUTPUT1", [1, 16]),
    ]  # fmt: skip
    assert not any(output.parameters for output in response.outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out, np.int32, [1, 16])[0], a + b)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(out, np.int32, [1, 16], offset=INT32)[0], a - b
    )
    status = grpc.get_system_shared_memory_status()
    assert sorted(status.regions) == ["input_data", "output_data"]
    region = status.regions["input_data"]
    assert (region.name, region.key, region.offset, region.byte_size) == (
        "input_data", in_key, 0, 128,
    )  # fmt: skip
    grpc.unregister_system_shared_memory()
    assert not grpc.get_system_shared_memory_status().regions


def test_a_stream_reads_and_writes_regions_and_lets_them_go(grpc, regions):
    a, b = np.arange(16, dtype=np.int32), np.full(16, 2, dtype=np.int32)
    out, _, _ = _add_sub_regions(grpc, regions, a, b)
    inputs, outputs = _in_regions(grpcclient)
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put(error))
    grpc.async_stream_infer("simple", inputs, outputs=outputs)
    assert answers.get(timeout=30) is None
    grpc.stop_stream()
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out, np.int32, [1, 16])[0], a + b)
    grpc.unregister_system_shared_memory(client_timeout=30)  # the stream let go of them
    assert not grpc.get_system_shared_memory_status().regions


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_some_tensors_in_shared_memory_and_some_in_the_message(server, regions, protocol):
    """An input and an output in a region beside one sent and one answered in the message:
    tritonclient finds the second output's data by its position among the outputs."""
    module = httpclient if protocol == "http" else grpcclient
    address = server.address if protocol == "http" else server.grpc_address
    client = module.InferenceServerClient(address)
    a, b = np.arange(16, dtype=np.int32), np.full(16, 5, dtype=np.int32)
    region, key = regions.create("mixed", 2 * INT32)
    shm.set_shared_memory_region(region, [a])
    client.register_system_shared_memory("mixed", key, 2 * INT32)
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory("mixed", INT32)
    inputs[1].set_data_from_numpy(b.reshape(1, 16))
    outputs = [module.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
    outputs[0].set_shared_memory("mixed", INT32, offset=INT32)
    result = client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1")[0], a - b)
    sums = shm.get_contents_as_numpy(region, np.int32, [1, 16], offset=INT32)
    np.testing.assert_array_equal(sums[0], a + b)
    client.unregister_system_shared_memory()
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_tensors_in_shared_memory(server, regions, protocol):
    """Triton's simple_*_shm_string_client: BYTES in and out in their serialized form."""
    module = httpclient if protocol == "http" else grpcclient
    address = server.address if protocol == "http" else server.grpc_address
    client = module.InferenceServerClient(address)
    first = np.array([str(x).encode() for x in range(16)], dtype=object)
    second = np.array([b"1"] * 16, dtype=object)
    expected = [str(x + 1).encode() for x in range(16)], [str(x - 1).encode() for x in range(16)]
    handles, sizes = {}, {}
    contents = {
        "in0": first, "in1": second,
        "out0": np.array(expected[0], dtype=object), "out1": np.array(expected[1], dtype=object),
    }  # fmt: skip
    for name, values in contents.items():
        serialized = utils.serialize_byte_tensor(values)
        sizes[name] = utils.serialized_byte_size(serialized)
        handles[name], key = regions.create(name, sizes[name])
        if name.startswith("in"):
            shm.set_shared_memory_region(handles[name], [serialized])
        client.register_system_shared_memory(name, key, sizes[name])
    inputs = [module.InferInput(name, [1, 16], "BYTES") for name in ("INPUT0", "INPUT1")]
    outputs = [module.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
    for index, tensor in enumerate(inputs):
        tensor.set_shared_memory(f"in{index}", sizes[f"in{index}"])
    for index, output in enumerate(outputs):
        output.set_shared_memory(f"out{index}", sizes[f"out{index}"])
    result = client.infer("simple_string", inputs, outputs=outputs)
    for index, values in enumerate(expected):
        got = shm.get_contents_as_numpy(handles[f"out{index}"], np.object_, [1, 16])
        assert list(got[0]) == values
        assert result.get_output(f"OUTPUT{index}") is not None
    client.unregister_system_shared_memory()
    client.close()


def test_server_metadata_lists_the_extension(http):
    assert "system_shared_memory" in http.get_server_metadata()["extensions"]


# -- refusals ----------------------------------------------------------------------------


def _one_input_in(region: str, byte_size: int, offset: int = 0):
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory(region, byte_size, offset=offset)
    inputs[1].set_data_from_numpy(np.zeros((1, 16), np.int32))
    return inputs


def test_requests_outside_their_region_are_refused(http, regions):
    _, key = regions.create("small", 2 * INT32)
    http.register_system_shared_memory("small", key, 2 * INT32)
    where = "model 'simple': input 'INPUT0'"
    assert _error(lambda: http.infer("simple", _one_input_in("small", INT32, 100))) == (
        f"{where}: shared_memory_offset 100 + shared_memory_byte_size 64 runs past the end "
        "of region 'small' (128 bytes)"
    )
    assert _error(lambda: http.infer("simple", _one_input_in("small", 60))) == (
        f"{where}: shared_memory_byte_size 60 in region 'small' does not match shape [1, 16] "
        "of INT32, which takes 64 bytes"
    )
    assert _error(lambda: http.infer("simple", _one_input_in("nowhere", INT32))) == (
        f"{where}: no shared-memory region 'nowhere' is registered"
    )
    outputs = [httpclient.InferRequestedOutput("OUTPUT0")]
    outputs[0].set_shared_memory("small", 32)
    inputs = _one_input_in("small", INT32)
    assert _error(lambda: http.infer("simple", inputs, outputs=outputs)) == (
        "model 'simple': output 'OUTPUT0': 64 bytes do not fit the 32 bytes given for it in "
        "region 'small' (shared_memory_byte_size)"
    )


def test_grpc_refusals_carry_triton_status_codes(grpc, regions):
    _, key = regions.create("small", 2 * INT32)
    grpc.register_system_shared_memory("small", key, 2 * INT32)
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory("small", INT32, offset=100)
    inputs[1].set_data_from_numpy(np.zeros((1, 16), np.int32))
    assert _status_code(lambda: grpc.infer("simple", inputs)) == "StatusCode.INVALID_ARGUMENT"
    inputs[0].set_shared_memory("nowhere", INT32)
    assert _status_code(lambda: grpc.infer("simple", inputs)) == "StatusCode.NOT_FOUND"
    assert _status_code(lambda: grpc.get_system_shared_memory_status("nowhere")) == (
        "StatusCode.NOT_FOUND"
    )
    assert _status_code(lambda: grpc.register_system_shared_memory("small", key, 8)) == (
        "StatusCode.ALREADY_EXISTS"
    )


def test_registering_a_name_twice_fails_and_keeps_the_first(http, regions):
    _, key = regions.create("once", 64)
    http.register_system_shared_memory("once", key, 64)
    assert _error(lambda: http.register_system_shared_memory("once", key, 32)) == (
        "register system shared-memory region 'once': a region of that name is registered "
        "already. Hint: unregister it first, or choose another name"
    )
    assert http.get_system_shared_memory_status() == [
        {"name": "once", "key": key, "offset": 0, "byte_size": 64}
    ]


# -- lifetimes ---------------------------------------------------------------------------


def test_unregister_waits_for_the_requests_using_the_region(server, http, regions):
    folder = _version_folder(server, "gated")
    values = np.arange(4, dtype=np.float32).reshape(1, 4)
    handle, key = regions.create("gated_in", 16)
    shm.set_shared_memory_region(handle, [values])
    http.register_system_shared_memory("gated_in", key, 16)
    tensor = httpclient.InferInput("INPUT", [1, 4], "FP32")
    tensor.set_shared_memory("gated_in", 16)
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(_infer_alone, server.address, "gated", [tensor])
        wait_for((folder / "STARTED").exists, what="the gated request to start")
        unregistering = pool.submit(_unregister_alone, server.address, "gated_in")
        # The name goes at once: a new request naming it is refused ...
        wait_for(lambda: http.get_system_shared_memory_status() == [], what="the name to go")
        assert _error(lambda: http.infer("gated", [tensor])) == (
            "model 'gated': input 'INPUT': no shared-memory region 'gated_in' is registered"
        )
        # ... while the unregister waits for the request that holds the region.
        assert not unregistering.done()
        (folder / "GO").touch()
        np.testing.assert_array_equal(running.result(timeout=60), values * 2)
        unregistering.result(timeout=60)


def _pending(server) -> float:
    return metric(server, "nv_inference_pending_request_count", "gated")


def _version_folder(server, model: str) -> Path:
    repository = Path(server.process.args[server.process.args.index("--model-repository") + 1])
    return repository / model / "1"


def _infer_alone(address: str, model: str, inputs: list) -> np.ndarray:
    with httpclient.InferenceServerClient(address) as client:
        return client.infer(model, inputs).as_numpy("OUTPUT")


def _unregister_alone(address: str, name: str) -> None:
    with httpclient.InferenceServerClient(address) as client:
        client.unregister_system_shared_memory(name)


def test_a_region_whose_file_was_unlinked_still_works(http, regions):
    a, b = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
    out, in_key, out_key = _add_sub_regions(http, regions, a, b)
    _file(in_key).unlink()
    _file(out_key).unlink()
    inputs, outputs = _in_regions(httpclient)
    http.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out, np.int32, [1, 16])[0], a + b)


def test_a_file_cut_short_is_refused_and_the_server_lives_on(server, http, regions):
    a, b = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
    _, in_key, out_key = _add_sub_regions(http, regions, a, b)
    inputs, outputs = _in_regions(httpclient)
    os.truncate(_file(in_key), 0)  # the client's own mapping is unusable from here on
    assert _error(lambda: http.infer("simple", inputs, outputs=outputs)) == (
        f"model 'simple': input 'INPUT0': region 'input_data' lies past the end of its file "
        f"{_file(in_key)} (0 bytes now, 64 needed): the client shrank the file after "
        "registering it. Hint: unregister the region and register it again"
    )
    os.truncate(_file(out_key), 0)
    inputs, outputs = _in_regions(httpclient)
    inputs[0].set_data_from_numpy(a.reshape(1, 16))
    inputs[1].set_data_from_numpy(b.reshape(1, 16))
    assert _error(lambda: http.infer("simple", inputs, outputs=outputs)) == (
        f"model 'simple': output 'OUTPUT0': region 'output_data' lies past the end of its file "
        f"{_file(out_key)} (0 bytes now, 64 needed): the client shrank the file after "
        "registering it. Hint: unregister the region and register it again"
    )
    assert _file(out_key).stat().st_size == 0  # nothing was written into it
    http.unregister_system_shared_memory()
    assert http.is_server_live()
    plain = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    plain[0].set_data_from_numpy(a.reshape(1, 16))
    plain[1].set_data_from_numpy(b.reshape(1, 16))
    np.testing.assert_array_equal(http.infer("simple", plain).as_numpy("OUTPUT0")[0], a + b)
    assert server.process.poll() is None


def test_a_file_cut_short_while_its_request_waits_fails_that_request_alone(server, regions):
    """The size is fine when the request comes, and gone when its batch is assembled: the
    read comes up short (a mapping would have killed the server), the request fails on its
    own, and the server goes on."""
    folder = _version_folder(server, "gated")
    for name in ("STARTED", "GO"):
        (folder / name).unlink(missing_ok=True)
    handle, key = regions.create("cut_later", 16)
    shm.set_shared_memory_region(handle, [np.ones((1, 4), np.float32)])
    plain = httpclient.InferInput("INPUT", [1, 4], "FP32")
    plain.set_data_from_numpy(np.ones((1, 4), np.float32))
    shared = httpclient.InferInput("INPUT", [1, 4], "FP32")
    shared.set_shared_memory("cut_later", 16)
    with httpclient.InferenceServerClient(server.address) as client:
        client.register_system_shared_memory("cut_later", key, 16)
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(_infer_alone, server.address, "gated", [plain])
        wait_for((folder / "STARTED").exists, what="the gated request to start")
        staged = pool.submit(_infer_alone, server.address, "gated", [plain])  # next in line
        wait_for(lambda: _pending(server) == 1, what="the second request to be staged")
        waiting = pool.submit(_infer_alone, server.address, "gated", [shared])  # queued
        wait_for(lambda: _pending(server) == 2, what="the third request to queue")
        os.truncate(_file(key), 0)
        (folder / "GO").touch()
        np.testing.assert_array_equal(running.result(timeout=60), np.full((1, 4), 2))
        np.testing.assert_array_equal(staged.result(timeout=60), np.full((1, 4), 2))
        with pytest.raises(InferenceServerException) as caught:
            waiting.result(timeout=60)
    assert caught.value.status() == "400"
    assert "model 'gated': input 'INPUT': region 'cut_later'" in caught.value.message()
    assert "the client cut its file short" in caught.value.message()
    assert server.process.poll() is None
    with httpclient.InferenceServerClient(server.address) as client:
        client.unregister_system_shared_memory("cut_later")
        assert client.infer("gated", [plain]).as_numpy("OUTPUT") is not None
    for name in ("STARTED", "GO"):  # the gate closed again for whoever comes next
        (folder / name).unlink(missing_ok=True)


# -- hostile registrations ----------------------------------------------------------------


@pytest.fixture
def odd_files():
    """Things in /dev/shm that are not shared-memory objects: a link out, a FIFO, a folder."""
    tag = uuid.uuid4().hex[:12]
    made = {
        "link": SHM / f"reposerve-link-{tag}",
        "fifo": SHM / f"reposerve-fifo-{tag}",
        "folder": SHM / f"reposerve-folder-{tag}",
    }
    made["link"].symlink_to("/etc/hostname")
    os.mkfifo(made["fifo"])
    made["folder"].mkdir()
    yield {kind: f"/{path.name}" for kind, path in made.items()}
    made["link"].unlink()
    made["fifo"].unlink()
    made["folder"].rmdir()


def test_hostile_registrations_are_400_and_change_nothing(server, http, regions, odd_files):
    _, key = regions.create("fine", 64)
    http.register_system_shared_memory("fine", key, 64)
    before = http.get_system_shared_memory_status()
    label = "register system shared-memory region 'r'"
    body_error = (
        f'{label}: the body must be JSON {{"key": "/name", "offset": int, "byte_size": int}}: '
    )

    def key_error(bad: str) -> str:
        return (
            f"{label}: key {bad!r:.80} does not name a shared-memory object; expected '/name' (one "
            "file name under /dev/shm, as shm_open and tritonclient.utils.shared_memory name "
            "them)"
        )

    cases = [
        (b'{"offset": 0, "byte_size": 8}', body_error + "Object missing required field `key`"),
        (b'{"key": "/x"}', body_error + "Object missing required field `byte_size`"),
        (b"[1, 2]", body_error + "Expected `object`, got `array`"),
        (b'{"key": 5, "byte_size": 8}', body_error + "Expected `str`, got `int` - at `$.key`"),
        ({"key": key, "offset": -1, "byte_size": 8},
         body_error + "Expected `int` >= 0 - at `$.offset`"),
        ({"key": key, "byte_size": 0},
         f"{label}: byte_size must be > 0 and offset >= 0, got byte_size 0 and offset 0"),
        ({"key": key, "byte_size": 65},
         f"{label}: offset 0 + byte_size 65 = 65 runs past the end of '{key}' (64 bytes)"),
        ({"key": key, "offset": 2**62, "byte_size": 2**62},
         f"{label}: offset {2**62} + byte_size {2**62} = {2**63} runs past the end of "
         f"'{key}' (64 bytes)"),
        ({"key": "/../etc/passwd", "byte_size": 8}, key_error("/../etc/passwd")),
        ({"key": "/a/b", "byte_size": 8}, key_error("/a/b")),
        ({"key": "..", "byte_size": 8}, key_error("..")),
        ({"key": "", "byte_size": 8}, key_error("")),
        ({"key": "/" + "x" * 300, "byte_size": 8}, key_error("/" + "x" * 300)),
        ({"key": "/reposerve-nothing-here", "byte_size": 8},
         f"{label}: no shared-memory object '/reposerve-nothing-here' (/dev/shm/"
         "reposerve-nothing-here does not exist). Hint: create it first "
         "(tritonclient.utils.shared_memory.create_shared_memory_region)"),
        ({"key": odd_files["link"], "byte_size": 8},
         f"{label}: '{odd_files['link']}' (/dev/shm{odd_files['link']}) is a symbolic link, "
         "not a shared-memory object"),
        ({"key": odd_files["fifo"], "byte_size": 8},
         f"{label}: '{odd_files['fifo']}' (/dev/shm{odd_files['fifo']}) is not a "
         "shared-memory object"),
        ({"key": odd_files["folder"], "byte_size": 8},
         f"{label}: cannot open '{odd_files['folder']}' (/dev/shm{odd_files['folder']}): "
         "Is a directory"),
    ]  # fmt: skip
    url = f"{server.url}/v2/systemsharedmemory/region/r/register"
    for body, expected in cases:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = httpx.post(url, content=raw)
        assert (sent.status_code, sent.json()) == (400, {"error": expected}), body
    assert http.get_system_shared_memory_status() == before


def test_registrations_past_the_bound_hold_no_descriptor_and_the_server_goes_on(tmp_path, regions):
    """Each region holds its file open. Past --client-shm-max-regions a registration is
    refused (400; gRPC INVALID_ARGUMENT) and opens nothing, so however many a client sends,
    the server's descriptors stay bounded: new connections and a model reload still work."""
    root = _repository(tmp_path / "repository")
    bound, sent = 16, 200
    flags = ("--allow-client-shm", "true", "--client-shm-max-regions", str(bound))
    with running_server(root, tmp_path, *flags) as server:
        _, key = regions.create("many", 64)
        descriptors = Path(f"/proc/{server.process.pid}/fd")
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/v2").status_code == 200  # the connection is open before
            before = len(list(descriptors.iterdir()))
            answers = [
                client.post(
                    f"/v2/systemsharedmemory/region/r{index}/register",
                    json={"key": key, "byte_size": 64},
                )
                for index in range(sent)
            ]
            held = len(list(descriptors.iterdir())) - before

        def refused(name: str) -> str:
            return (
                f"register system shared-memory region '{name}': 16 regions hold their files "
                "open already, the most this server keeps (--client-shm-max-regions 16; a "
                "region unregistered while requests use it counts until they end). Hint: "
                "unregister the regions no longer in use"
            )

        assert [answer.status_code for answer in answers] == [200] * bound + [400] * (sent - bound)
        assert [answer.json()["error"] for answer in answers[bound:]] == [
            refused(f"r{index}") for index in range(bound, sent)
        ]
        # One file per region kept, give or take what the server opens meanwhile itself
        # (without the bound: one per registration, 200).
        assert bound <= held <= bound + 8, held
        with grpcclient.InferenceServerClient(server.grpc_address) as client:
            with pytest.raises(InferenceServerException) as caught:
                client.register_system_shared_memory("by_grpc", key, 64)
            assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert caught.value.message() == refused("by_grpc")
        load = httpx.post(f"{server.url}/v2/repository/models/simple/load", timeout=120)
        assert load.status_code == 200, load.text
        a, b = np.arange(16, dtype=np.int32), np.full(16, 4, dtype=np.int32)
        for module, address in ((httpclient, server.address), (grpcclient, server.grpc_address)):
            with module.InferenceServerClient(address) as client:  # a new connection
                inputs = [
                    module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")
                ]
                inputs[0].set_data_from_numpy(a.reshape(1, 16))
                inputs[1].set_data_from_numpy(b.reshape(1, 16))
                total = client.infer("simple", inputs).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(total[0], a + b)
        with httpclient.InferenceServerClient(server.address) as client:
            client.unregister_system_shared_memory("r0")
            client.register_system_shared_memory("again", key, 64)  # a place came free
            client.unregister_system_shared_memory()


# -- the flag, the access rule and CUDA ----------------------------------------------------


def test_without_the_flag_shared_memory_is_refused_naming_it(tmp_path, regions):
    root = _repository(tmp_path / "repository")
    with running_server(root, tmp_path) as off:
        base = f"{off.url}/v2/systemsharedmemory"
        assert httpx.get(f"{base}/status").json() == []  # as Triton: status answers
        disabled = (
            "client shared memory is off on this server. Hint: start it with "
            "--allow-client-shm true"
        )
        _, key = regions.create("r", 64)
        for call in (
            lambda: httpx.post(f"{base}/region/r/register", json={"key": key, "byte_size": 64}),
            lambda: httpx.post(f"{base}/unregister"),
            lambda: httpx.post(f"{off.url}/v2/cudasharedmemory/unregister"),
        ):
            answer = call()
            assert (answer.status_code, answer.json()) == (501, {"error": disabled})
        with httpclient.InferenceServerClient(off.address) as client:
            assert _error(lambda: client.infer("simple", _one_input_in("r", INT32))) == (
                f"model 'simple': input 'INPUT0': shared_memory_region 'r': {disabled}"
            )
            assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
        with grpcclient.InferenceServerClient(off.grpc_address) as client:
            assert _status_code(lambda: client.register_system_shared_memory("r", key, 64)) == (
                "StatusCode.UNIMPLEMENTED"
            )
            assert not client.get_system_shared_memory_status().regions


def test_registration_is_a_control_api(tmp_path, regions):
    root = _repository(tmp_path / "repository")
    flags = ("--allow-client-shm", "true", "--http-restricted-api", "shared-memory:admin-key=s3")
    with running_server(root, tmp_path, *flags) as guarded:
        _, key = regions.create("r", 64)
        url = f"{guarded.url}/v2/systemsharedmemory/region/r/register"
        refused = httpx.post(url, json={"key": key, "byte_size": 64})
        assert (refused.status_code, refused.json()) == (
            403, {"error": "This API is restricted, expecting header 'admin-key'"},
        )  # fmt: skip
        assert httpx.post(url, json={"key": key, "byte_size": 64}, headers={"admin-key": "s3"})
        assert httpx.post(
            f"{guarded.url}/v2/systemsharedmemory/unregister", headers={"admin-key": "s3"}
        ).is_success


def test_cuda_shared_memory_answers_without_a_gpu(server, http):
    assert http.get_cuda_shared_memory_status() == []
    http.unregister_cuda_shared_memory()  # Triton's examples start with it
    http.unregister_cuda_shared_memory("anything")
    answer = httpx.post(
        f"{server.url}/v2/cudasharedmemory/region/c/register",
        json={"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8},
    )
    assert answer.status_code in (400, 501)
    message = answer.json()["error"]
    assert message.startswith("register CUDA shared-memory region 'c': CUDA shared memory ")
    assert message.endswith(
        "Hint: use system shared memory (v2/systemsharedmemory, tritonclient.utils.shared_memory)"
    )
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        assert not client.get_cuda_shared_memory_status().regions
        client.unregister_cuda_shared_memory()


def _pinned_to_front_one(server) -> httpx.Client:
    """An HTTP client on one kept-alive connection that front process 1 serves (found by
    its reposerve_front_calls_total moving), so its calls cross to the core."""

    def calls() -> float:
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
        found = re.search(r'^reposerve_front_calls_total\{front="1"\} (\S+)$', text, re.M)
        assert found, text
        return float(found[1])

    for _ in range(60):
        client = httpx.Client(base_url=server.url, limits=httpx.Limits(max_connections=1))
        before = calls()
        assert client.get("/v2").status_code == 200
        if calls() > before:
            return client
        client.close()
    raise AssertionError("no connection landed on front 1")


def test_a_front_process_passes_shared_memory_through_the_core(tmp_path, regions):
    root = _repository(tmp_path / "repository")
    flags = ("--allow-client-shm", "true", "--http-workers", "2")
    with running_server(root, tmp_path, *flags) as fronts:
        client = _pinned_to_front_one(fronts)
        a, b = np.arange(16, dtype=np.int32), np.full(16, 7, dtype=np.int32)
        handle, key = regions.create("both", 4 * INT32)
        shm.set_shared_memory_region(handle, [a, b])
        region = {"key": key, "offset": 0, "byte_size": 4 * INT32}
        assert client.post("/v2/systemsharedmemory/region/both/register", json=region).is_success
        assert client.get("/v2/systemsharedmemory/status").json() == [{"name": "both", **region}]

        def place(offset: int) -> dict:
            return {"shared_memory_region": "both", "shared_memory_byte_size": INT32,
                    "shared_memory_offset": offset}  # fmt: skip

        body = {
            "inputs": [
                {
                    "name": f"INPUT{i}",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": place(i * INT32),
                }
                for i in (0, 1)
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": place(2 * INT32)}, {"name": "OUTPUT1"}],
        }
        answer = client.post("/v2/models/simple/infer", json=body).json()
        assert answer["outputs"] == [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": (a - b).tolist()},
        ]
        sums = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=2 * INT32)
        np.testing.assert_array_equal(sums[0], a + b)
        assert client.post("/v2/systemsharedmemory/unregister").is_success
        assert client.get("/v2/systemsharedmemory/status").json() == []
        client.close()
