"""Client shared memory (Triton's shared-memory extension): the regions clients register,
and the claims that the requests naming them hold.

A client creates a POSIX shared-memory object (``/dev/shm/NAME``, as shm_open and
``tritonclient.utils.shared_memory`` make one), registers a window of it as a named
region, and then names the region in a tensor's parameters instead of sending the data:

  input   a Tensor whose raw is a ``FileWindow`` on the client's file: the batch is read
          from it straight into the instance's slot (``preadv``), the one copy a request
          body's bytes take too (BYTES are read at once: their framing is checked)
  output  copied from the instance's slot straight into the client's file (``pwrite``)

Safety. The file is a client's, which it may cut short at any time, and reading a mapping
past the end of its file kills the reader (SIGBUS). So nothing here maps it: reads and
writes go through the descriptor, where a file cut short costs a short read (that
request fails, the others of its batch go on) and a write grows it back. Sizes are also
checked (fstat) when the region is registered and before each request uses it, for a
clear error early. A region whose file the client unlinks stays readable: the
descriptor keeps the memory.

Bound. Each region holds one descriptor open from its registration until it is closed
(where Triton holds a mapping), so a client registering without end would take every
descriptor the process may open, and with them new connections and model loads. At most
``max_regions`` files are held at once (--client-shm-max-regions): the registered regions
and those unregistered but still used by requests (their files stay open until those
end); a registration past it is refused, saying so. The bound is also held to a quarter
of the process's open-file limit, so the rest stays the server's own.

Regions are counted while requests use them: ``unregister`` takes the name away at once
(new requests naming it are refused, the name may be registered again) and waits for the
requests still using the region before unmapping it. Waiting, rather than failing or
answering at once as Triton does, makes the answer mean what a client needs it to: once
unregister returns, the server will neither read nor write that memory again, so the
client may free or reuse it; a client that unregisters after its requests end (the usual
order, and what Triton's examples do) never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import stat
import threading
from pathlib import Path

from reposerve.errors import ErrorKind, SharedMemoryError
from reposerve.operations import CudaRegion, SystemRegion
from reposerve.protocol.shared_memory import TensorRegion
from reposerve.repository.gpus import discover
from reposerve.tensor import FileWindow, Tensor

log = logging.getLogger("reposerve.shared_memory")

SHM_ROOT = Path("/dev/shm")  # where shm_open keeps its objects on Linux
_NAME_MAX = 255
MAX_REGIONS = 1024  # --client-shm-max-regions' default
# Client regions may hold at most this share of the open files the process may have.
_FILES_SHARE = 4
DISABLED = "client shared memory is off on this server. Hint: start it with --allow-client-shm true"


class _Region:
    """One registered region: the client's file, mapped, and the requests using it."""

    __slots__ = ("status", "path", "_fd", "users", "gone", "closed", "_loop")

    def __init__(self, status: SystemRegion, path: Path, fd: int) -> None:
        self.status = status
        self.path = path  # for messages
        self._fd = fd
        self.users = 0  # requests holding a claim
        self.gone = False  # unregistered: closed when the last user lets go
        self.closed = asyncio.Event()  # set once unmapped (on the loop: see ``close``)
        self._loop = asyncio.get_running_loop()

    def check_file(self, place: TensorRegion, where: str) -> None:
        """Refuse ``place`` when the client's file no longer covers it (see the module's
        docstring: it is about to be read or written)."""
        end = self.status.offset + place.offset + place.byte_size
        size = os.fstat(self._fd).st_size
        if size < end:
            raise SharedMemoryError(
                f"{where}: region '{place.region}' lies past the end of its file "
                f"{self.path} ({size} bytes now, {end} needed): the client shrank the file "
                "after registering it. Hint: unregister the region and register it again"
            )

    def window(self, place: TensorRegion, where: str) -> FileWindow:
        """The bytes ``place`` names, read when copied."""
        label = f"{where}: region '{place.region}' ({self.path})"
        return FileWindow(self._fd, self.status.offset + place.offset, place.byte_size, label)

    def write(self, place: TensorRegion, data: bytes | memoryview) -> None:
        """``data`` into the file at ``place`` (``pwrite``: never a fault, see above)."""
        view = memoryview(data).cast("B")
        position = self.status.offset + place.offset
        done = 0
        while done < len(view):
            try:
                written = os.pwrite(self._fd, view[done:], position + done)
            except OSError as exc:  # /dev/shm full (ENOSPC), a file size limit (EFBIG)
                raise SharedMemoryError(
                    f"region '{place.region}': could not write to {self.path}: {exc.strerror}"
                ) from None
            if written <= 0:
                raise SharedMemoryError(f"region '{place.region}': {self.path} took no bytes")
            done += written

    def close(self) -> None:
        """Close the file; called by whoever lets go last, which may be a decoding thread."""
        os.close(self._fd)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self.closed.set)


class SharedMemory:
    """The regions clients registered (Triton's system shared memory), by name; CUDA
    shared memory answers for the GPU path to come. ``allowed``: --allow-client-shm;
    ``max_regions``: --client-shm-max-regions (see the module's docstring)."""

    def __init__(
        self, allowed: bool, root: Path = SHM_ROOT, max_regions: int = MAX_REGIONS
    ) -> None:
        self.allowed = allowed
        self._root = root
        self._regions: dict[str, _Region] = {}
        self.max_regions = region_bound(max_regions)
        if allowed and self.max_regions < max_regions:
            log.warning(
                "client shared memory: at most %d regions (not %d): each holds an open file, "
                "and regions may hold a quarter of the %d this process may open",
                self.max_regions, max_regions, self.max_regions * _FILES_SHARE,
            )  # fmt: skip
        self._files = 0  # regions whose file is open: registered, or unregistered and in use
        # Claims may be taken in a decoding thread (a large body is decoded off the loop).
        self._lock = threading.Lock()
        self._refusing = Claims(self)  # switched off, every request's: it never holds any

    def claims(self) -> Claims:
        """A new request's claims (none yet)."""
        return Claims(self) if self.allowed else self._refusing

    # -- system shared memory ------------------------------------------------------------

    def status(self, name: str | None) -> list[SystemRegion]:
        """Every region, or the one named (an error if there is none)."""
        if not name:
            return [region.status for region in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise self._unknown(f"system shared-memory region '{name}'")
        return [region.status]

    def register(self, wanted: SystemRegion) -> None:
        """Keep ``wanted`` (a window of a client's shm object) under its name. Every check
        comes before anything is kept: a refused registration changes nothing."""
        self._check_allowed()
        name = wanted.name
        label = f"register system shared-memory region '{name}'"
        if not name:
            raise SharedMemoryError("register system shared memory: a region needs a name")
        if name in self._regions:
            raise SharedMemoryError(
                f"{label}: a region of that name is registered already. Hint: unregister it "
                "first, or choose another name",
                kind=ErrorKind.ALREADY_EXISTS,
            )
        if wanted.byte_size <= 0 or wanted.offset < 0:
            raise SharedMemoryError(
                f"{label}: byte_size must be > 0 and offset >= 0, got byte_size "
                f"{wanted.byte_size} and offset {wanted.offset}"
            )
        if self._files >= self.max_regions:
            raise SharedMemoryError(
                f"{label}: {self._files} regions hold their files open already, the most this "
                f"server keeps (--client-shm-max-regions {self.max_regions}; a region "
                "unregistered while requests use it counts until they end). Hint: unregister "
                "the regions no longer in use"
            )
        path = self._root / _object_name(wanted.key, label)
        fd = _open(path, wanted.key, label)
        try:
            size = os.fstat(fd).st_size
            end = wanted.offset + wanted.byte_size
            if end > size:
                raise SharedMemoryError(
                    f"{label}: offset {wanted.offset} + byte_size {wanted.byte_size} = {end} "
                    f"runs past the end of '{wanted.key}' ({size} bytes)"
                )
        except BaseException:
            os.close(fd)
            raise
        region = _Region(wanted, path, fd)
        with self._lock:  # (register runs on the loop alone: the count above still holds)
            self._regions[name] = region
            self._files += 1

    async def unregister(self, name: str | None) -> None:
        """Take the named region (every region, when None) away, and return once the
        requests still using it have ended and its file is closed. Unregistering a name that
        is not registered does nothing (as Triton)."""
        self._check_allowed()
        with self._lock:
            if name:
                leaving = [region] if (region := self._regions.pop(name, None)) else []
            else:
                leaving = list(self._regions.values())
                self._regions.clear()
            for region in leaving:
                region.gone = True
                if not region.users:
                    self._files -= 1
                    region.close()
        for region in leaving:
            await region.closed.wait()

    # -- CUDA shared memory: answered, until the GPU path comes -----------------------------

    def cuda_status(self, name: str | None) -> list[CudaRegion]:
        """None registered: an empty list, or the named one's absence."""
        if name:
            raise self._unknown(f"CUDA shared-memory region '{name}'")
        return []

    async def register_cuda(self, name: str) -> None:
        self._check_allowed()
        label = f"register CUDA shared-memory region '{name}'"
        gpus = await asyncio.to_thread(discover)  # runs the GPU probe once per process
        if not gpus.visible:
            raise SharedMemoryError(
                f"{label}: CUDA shared memory needs a GPU, and none is visible "
                f"({gpus.describe()}). Hint: use system shared memory "
                "(v2/systemsharedmemory, tritonclient.utils.shared_memory)"
            )
        raise SharedMemoryError(
            f"{label}: CUDA shared memory is not supported by reposerve yet. Hint: use "
            "system shared memory (v2/systemsharedmemory, tritonclient.utils.shared_memory)",
            kind=ErrorKind.UNSUPPORTED,
        )

    def unregister_cuda(self, name: str | None) -> None:
        """Nothing is ever registered: nothing to do (Triton answers a name it does not
        hold the same way)."""
        self._check_allowed()

    # -- claims --------------------------------------------------------------------------

    def _claim(self, place: TensorRegion, where: str, claims: Claims) -> _Region:
        """One more user of the region ``place`` names, held by ``claims``."""
        if not self.allowed:
            raise SharedMemoryError(f"{where}: shared_memory_region '{place.region}': {DISABLED}")
        with self._lock:
            if claims._released:
                raise SharedMemoryError(f"{where}: the request was cancelled", ErrorKind.CANCELLED)
            region = self._regions.get(place.region)
            if region is not None:
                region.users += 1
                claims._held[place.region] = region
        if region is None:
            raise SharedMemoryError(
                f"{where}: no shared-memory region '{place.region}' is registered",
                kind=ErrorKind.NOT_FOUND,
            )
        return region

    def _let_go(self, region: _Region) -> None:
        with self._lock:
            region.users -= 1
            last = region.gone and not region.users
            if last:
                self._files -= 1
        if last:
            region.close()

    def _check_allowed(self) -> None:
        if not self.allowed:
            raise SharedMemoryError(DISABLED, kind=ErrorKind.UNSUPPORTED)

    def _unknown(self, what: str) -> SharedMemoryError:
        hint = "" if self.allowed else f"; {DISABLED}"
        return SharedMemoryError(f"no {what} is registered{hint}", kind=ErrorKind.NOT_FOUND)


class Claims:
    """The regions one request uses, held from its decoding until its answer is let go
    (``release``, once, on the event loop: an unregister waiting for them wakes there)."""

    __slots__ = ("_memory", "_held", "_released")

    def __init__(self, memory: SharedMemory) -> None:
        self._memory = memory
        self._held: dict[str, _Region] = {}
        # Released (its request ended or was cancelled): a decoding thread still running
        # for it may claim no more (``_claim``), or the claim would never be let go.
        self._released = False

    @property
    def held(self) -> bool:
        """Whether the request named any region."""
        return bool(self._held)

    def read(self, place: TensorRegion, where: str) -> FileWindow:
        region = self._take(place, where)
        region.check_file(place, where)
        return region.window(place, where)

    def reserve(self, place: TensorRegion, where: str) -> None:
        self._take(place, where)

    def place(
        self,
        outputs: list[tuple[str, Tensor, bool]],
        regions: dict[str, TensorRegion],
        model: str,
    ) -> frozenset[str]:
        """Write each output that has a region into it; ``outputs`` keeps such an output
        as its metadata alone (no bytes). Returns their names."""
        placed: set[str] = set()
        for index, (name, tensor, _) in enumerate(outputs):
            place = regions.get(name)
            if place is None:
                continue
            where = f"model '{model}': output '{name}'"
            nbytes = len(tensor.raw)
            if nbytes > place.byte_size:
                raise SharedMemoryError(
                    f"{where}: {nbytes} bytes do not fit the {place.byte_size} bytes given for "
                    f"it in region '{place.region}' (shared_memory_byte_size)"
                )
            region = self._held[place.region]
            region.check_file(place, where)
            region.write(place, tensor.memory())
            placed.add(name)
            outputs[index] = (name, Tensor(tensor.datatype, tensor.shape, b""), False)
        return frozenset(placed)

    def release(self) -> None:
        with self._memory._lock:
            self._released = True
            held, self._held = self._held, {}
        for region in held.values():
            self._memory._let_go(region)

    def _take(self, place: TensorRegion, where: str) -> _Region:
        """The region, claimed once per request however many of its tensors it holds,
        checked to hold ``place``."""
        region = self._held.get(place.region)
        if region is None:
            region = self._memory._claim(place, where, self)
        size = region.status.byte_size
        if place.offset + place.byte_size > size:
            raise SharedMemoryError(
                f"{where}: shared_memory_offset {place.offset} + shared_memory_byte_size "
                f"{place.byte_size} runs past the end of region '{place.region}' "
                f"({size} bytes)"
            )
        return region


def region_bound(wanted: int) -> int:
    """``wanted``, or a quarter of the files this process may open if that is fewer."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, soft // _FILES_SHARE)


def _object_name(key: str, label: str) -> str:
    """The file name of shm object ``key`` under /dev/shm, by shm_open's rules: leading
    slashes dropped, then one file name: no other slash, not '.' or '..', no NUL."""
    name = key.lstrip("/")
    if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > _NAME_MAX:
        raise SharedMemoryError(
            f"{label}: key {key!r:.80} does not name a shared-memory object; expected '/name' "
            f"(one file name under {SHM_ROOT}, as shm_open and tritonclient.utils.shared_memory "
            "name them)"
        )
    return name


def _open(path: Path, key: str, label: str) -> int:
    """The shm object's file, opened for reading and writing; it must be a regular file
    in the shared-memory folder itself (no symbolic link out of it)."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise SharedMemoryError(
            f"{label}: no shared-memory object '{key}' ({path} does not exist). Hint: create "
            "it first (tritonclient.utils.shared_memory.create_shared_memory_region)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise SharedMemoryError(
                f"{label}: '{key}' ({path}) is a symbolic link, not a shared-memory object"
            ) from None
        raise SharedMemoryError(f"{label}: cannot open '{key}' ({path}): {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_dev != os.stat(path.parent).st_dev:
            raise SharedMemoryError(f"{label}: '{key}' ({path}) is not a shared-memory object")
    except BaseException:
        os.close(fd)
        raise
    return fd
