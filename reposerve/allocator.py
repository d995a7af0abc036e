"""The C allocator's threshold for large blocks, fixed where glibc would let it float.

glibc maps a block of at least its *mmap threshold* on its own and unmaps it when freed;
smaller blocks come from the heap, whose free pages go back to the system only from its
top. By default the threshold floats: freeing a mapped block raises it to that block's
size (up to 32 MiB). After a few large messages (a 30 MiB gRPC request, a big JSON body)
blocks of that size come from the heap, and one small allocation made meanwhile above them
keeps their pages for good. Measured with tools/soak's 8-32 MiB gRPC messages beside small
requests: a front grew 145 -> 188 MiB PSS over 120 of them, and stayed at 77 -> 78 MiB with
the threshold fixed (which also halves what it holds after the first ones).
"""

from __future__ import annotations

import ctypes
import ctypes.util

LARGE_BLOCK_BYTES = 4 << 20
_M_MMAP_THRESHOLD = -3  # the parameter's number in glibc's malloc.h


def return_large_blocks(threshold: int = LARGE_BLOCK_BYTES) -> bool:
    """Have blocks of ``threshold`` bytes and more mapped on their own and given back when
    freed, from now on. A server process calls it once at start; an embedding process is
    left as its owner set it. False where the C library is not glibc (nothing changed)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return False  # musl and others: no mallopt, or its parameters mean other things
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
