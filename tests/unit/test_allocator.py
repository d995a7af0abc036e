"""Large blocks go back to the system once freed (reposerve.allocator), where glibc would
keep them in its heap: the pattern is a front's, large messages with small allocations
between them. Each case runs in a fresh interpreter, whose allocator has seen nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reposerve.allocator import return_large_blocks

pytestmark = pytest.mark.unit

MIB = 1 << 20
PATTERN = """
import os, random, sys
from reposerve.allocator import return_large_blocks
if sys.argv[1] == "fixed":
    assert return_large_blocks()
def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
rng, kept = random.Random(7), []
message = bytearray(32 << 20)  # the largest first: glibc's threshold floats up to it
del message
before = resident()
for _ in range(40):
    message = bytearray(rng.randint(8 << 20, 30 << 20))
    kept.append(bytearray(4096))  # allocated while the message is alive, kept after it
    del message
print(resident() - before)
"""


def _growth(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PATTERN, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(not return_large_blocks(), reason="the C library is not glibc")
def test_large_blocks_freed_between_small_ones_are_given_back():
    assert _growth("floating") > 16 * MIB  # what glibc keeps unless told (the test can fail)
    assert _growth("fixed") < 4 * MIB
