"""The client shared-memory registry (``reposerve.shared_memory``) on files in a temporary
folder standing in for /dev/shm: windows at any offset, the checks before each use, and
an unregister that waits for the requests holding a region."""

from __future__ import annotations

import asyncio
import os
import resource
from pathlib import Path

import pytest

from reposerve.errors import ErrorKind, ProtocolError, SharedMemoryError
from reposerve.operations import SystemRegion
from reposerve.protocol.shared_memory import TensorRegion, tensor_region
from reposerve.shared_memory import SharedMemory
from reposerve.tensor import Tensor

pytestmark = pytest.mark.unit

WHERE = "model 'm': input 'X'"


def _object(root: Path, name: str, content: bytes) -> str:
    (root / name).write_bytes(content)
    return f"/{name}"


def test_a_window_at_an_offset_inside_a_page_reads_its_own_bytes(tmp_path):
    async def run() -> None:
        memory = SharedMemory(True, tmp_path)
        content = bytes(range(256)) * 40  # 10240 bytes: the window starts inside page 2
        memory.register(SystemRegion("r", _object(tmp_path, "obj", content), 4100, 4000))
        claims = memory.claims()
        view = claims.read(TensorRegion("r", 16, 8), WHERE)
        assert view.read() == content[4108:4124]
        claims.release()
        await memory.unregister("r")

    asyncio.run(run())


def test_unregister_waits_for_the_claims_on_the_region(tmp_path):
    async def run() -> None:
        memory = SharedMemory(True, tmp_path)
        memory.register(SystemRegion("r", _object(tmp_path, "obj", b"\0" * 64), 0, 64))
        claims = memory.claims()
        claims.read(TensorRegion("r", 8), WHERE)
        unregistering = asyncio.ensure_future(memory.unregister("r"))
        await asyncio.sleep(0)
        assert memory.status(None) == []  # the name went at once
        with pytest.raises(SharedMemoryError, match="no shared-memory region 'r'"):
            memory.claims().read(TensorRegion("r", 8), WHERE)
        assert not unregistering.done()
        claims.release()
        await asyncio.wait_for(unregistering, 5)
        claims.release()  # again: nothing more to let go

    asyncio.run(run())


def test_a_file_cut_short_is_refused_before_reading_or_writing(tmp_path):
    async def run() -> None:
        memory = SharedMemory(True, tmp_path)
        key = _object(tmp_path, "obj", b"\0" * 64)
        memory.register(SystemRegion("r", key, 0, 64))
        os.truncate(tmp_path / "obj", 16)
        claims = memory.claims()
        with pytest.raises(SharedMemoryError) as caught:
            claims.read(TensorRegion("r", 8, 16), WHERE)
        assert caught.value.message == (
            f"{WHERE}: region 'r' lies past the end of its file {tmp_path / 'obj'} (16 bytes "
            "now, 24 needed): the client shrank the file after registering it. Hint: "
            "unregister the region and register it again"
        )
        claims.reserve(TensorRegion("r", 32, 32), WHERE)
        outputs = [("Y", Tensor("UINT8", (4,), b"\1\2\3\4"), False)]
        with pytest.raises(SharedMemoryError, match="lies past the end of its file"):
            claims.place(outputs, {"Y": TensorRegion("r", 32, 32)}, "m")
        assert (tmp_path / "obj").stat().st_size == 16  # nothing written, nothing grown
        claims.release()
        await memory.unregister(None)

    asyncio.run(run())


def test_outputs_are_written_into_their_region_and_kept_as_metadata(tmp_path):
    async def run() -> None:
        memory = SharedMemory(True, tmp_path)
        memory.register(SystemRegion("r", _object(tmp_path, "obj", b"\0" * 32), 8, 16))
        claims = memory.claims()
        claims.reserve(TensorRegion("r", 8, 4), WHERE)
        outputs = [("Y", Tensor("UINT8", (4,), b"\1\2\3\4"), False)]
        assert claims.place(outputs, {"Y": TensorRegion("r", 8, 4)}, "m") == {"Y"}
        assert outputs == [("Y", Tensor("UINT8", (4,), b""), False)]
        assert (tmp_path / "obj").read_bytes()[12:16] == b"\1\2\3\4"
        too_big = [("Y", Tensor("UINT8", (8,), b"\0" * 8), False)]
        with pytest.raises(SharedMemoryError) as caught:
            claims.place(too_big, {"Y": TensorRegion("r", 4, 4)}, "m")
        assert caught.value.message == (
            "model 'm': output 'Y': 8 bytes do not fit the 4 bytes given for it in region 'r' "
            "(shared_memory_byte_size)"
        )
        claims.release()
        await memory.unregister(None)

    asyncio.run(run())


def _past_the_bound(name: str, open_now: int, bound: int) -> str:
    return (
        f"register system shared-memory region '{name}': {open_now} regions hold their files "
        f"open already, the most this server keeps (--client-shm-max-regions {bound}; a "
        "region unregistered while requests use it counts until they end). Hint: unregister "
        "the regions no longer in use"
    )


def test_regions_past_the_bound_are_refused_until_a_file_is_closed(tmp_path):
    """The bound counts open files: a region unregistered while a request uses it keeps
    its place until that request lets go."""

    async def run() -> None:
        memory = SharedMemory(True, tmp_path, max_regions=2)
        key = _object(tmp_path, "obj", b"\0" * 64)
        memory.register(SystemRegion("a", key, 0, 64))
        memory.register(SystemRegion("b", key, 0, 64))
        with pytest.raises(SharedMemoryError) as caught:
            memory.register(SystemRegion("c", key, 0, 64))
        assert caught.value.kind is ErrorKind.INVALID_ARGUMENT
        assert caught.value.message == _past_the_bound("c", 2, 2)
        assert [region.name for region in memory.status(None)] == ["a", "b"]
        claims = memory.claims()
        claims.reserve(TensorRegion("a", 8), WHERE)
        unregistering = asyncio.ensure_future(memory.unregister("a"))
        await asyncio.sleep(0)
        assert [region.name for region in memory.status(None)] == ["b"]
        with pytest.raises(SharedMemoryError) as caught:
            memory.register(SystemRegion("c", key, 0, 64))  # a's file is still open
        assert caught.value.message == _past_the_bound("c", 2, 2)
        claims.release()
        await asyncio.wait_for(unregistering, 5)
        memory.register(SystemRegion("c", key, 0, 64))
        await memory.unregister(None)
        memory.register(SystemRegion("d", key, 0, 64))
        await memory.unregister(None)

    asyncio.run(run())


def test_the_bound_leaves_three_quarters_of_the_open_file_limit_to_the_server(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))
    try:
        assert SharedMemory(True, tmp_path, max_regions=1024).max_regions == 100
        assert SharedMemory(True, tmp_path, max_regions=64).max_regions == 64
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_switched_off_everything_but_status_names_the_flag(tmp_path):
    async def run() -> None:
        memory = SharedMemory(False, tmp_path)
        assert memory.status(None) == []
        with pytest.raises(SharedMemoryError) as caught:
            memory.register(SystemRegion("r", _object(tmp_path, "obj", b"\0" * 8), 0, 8))
        assert caught.value.kind is ErrorKind.UNSUPPORTED
        assert "--allow-client-shm true" in caught.value.message
        with pytest.raises(SharedMemoryError, match="--allow-client-shm true"):
            memory.claims().read(TensorRegion("r", 8), WHERE)
        with pytest.raises(SharedMemoryError, match="--allow-client-shm true"):
            await memory.unregister(None)

    asyncio.run(run())


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, None),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 8}, TensorRegion("r", 8)),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": 4},
            TensorRegion("r", 8, 4),
        ),
        ({"shared_memory_byte_size": 8}, "parameter shared_memory_byte_size needs "),
        ({"shared_memory_region": "r"}, "parameter shared_memory_byte_size must be given"),
        (
            {"shared_memory_region": 5, "shared_memory_byte_size": 8},
            "parameter shared_memory_region must be a registered region's name, got 5",
        ),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": -1},
            "parameter shared_memory_byte_size must be an int >= 0, got -1",
        ),
        (
            {
                "shared_memory_region": "r",
                "shared_memory_byte_size": 8,
                "shared_memory_offset": "4",
            },
            "parameter shared_memory_offset must be an int >= 0, got '4'",
        ),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": True},
            "parameter shared_memory_byte_size must be an int >= 0, got True",
        ),
    ],
)
def test_tensor_parameters_place_a_tensor_or_are_refused(parameters, expected):
    if expected is None or isinstance(expected, TensorRegion):
        assert tensor_region(parameters, WHERE) == expected
        return
    with pytest.raises(ProtocolError) as caught:
        tensor_region(parameters, WHERE)
    assert caught.value.message.startswith(f"{WHERE}: {expected}")
