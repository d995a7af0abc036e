"""``import tritonserver`` answered by ``reposerve.tritonserver``: the one import change a
port needs, made for code that cannot be changed (Triton's own tests)."""

import sys

from reposerve import tritonserver

sys.modules[__name__] = tritonserver
