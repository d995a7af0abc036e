"""tritonclient's system shared-memory utilities (``tritonclient.utils.shared_memory``), the
way Triton's examples use them, importable whatever setuptools is installed, and the
regions a test makes with them (``Regions``).

The 2.51 wheel finds its C library with ``pkg_resources``, which newer setuptools lack:
``tests.pkg_resources_stand_in`` stands in first; the module itself is tritonclient's.
"""

from __future__ import annotations

import contextlib
import uuid

import tests.pkg_resources_stand_in  # noqa: F401 - before tritonclient's shared memory

# isort: split
import tritonclient.utils.shared_memory as shm

__all__ = ["Regions", "shm"]


class Regions:
    """Shared-memory objects a test creates (tritonclient's way), each with a fresh key,
    destroyed after it."""

    def __init__(self) -> None:
        self.handles: list = []

    def create(self, name: str, byte_size: int) -> tuple[object, str]:
        key = f"/reposerve-test-{uuid.uuid4().hex[:12]}"
        self.handles.append(shm.create_shared_memory_region(name, key, byte_size))
        return self.handles[-1], key

    def close(self) -> None:
        for handle in self.handles:
            with contextlib.suppress(shm.SharedMemoryException):  # a test unlinked it
                shm.destroy_shared_memory_region(handle)
