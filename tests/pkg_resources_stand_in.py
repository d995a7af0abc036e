"""A stand-in for ``pkg_resources`` where setuptools no longer has it (81 removed it):
tritonclient 2.51's shared-memory module finds its C library with
``pkg_resources.resource_filename``, the one function given here. Imported before that
module (by the tests, and by the sitecustomize that ``tools.triton_client_examples`` puts
in front of Triton's examples, which run unchanged)."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path


def _resource_filename(package: str, resource: str) -> str:
    return str(Path(importlib.import_module(package).__file__).parent / resource)


try:
    import pkg_resources  # noqa: F401 - only whether it is there
except ImportError:
    _stand_in = types.ModuleType("pkg_resources")
    _stand_in.resource_filename = _resource_filename  # type: ignore[attr-defined]
    sys.modules["pkg_resources"] = _stand_in
