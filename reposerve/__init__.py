"""reposerve: a config-driven model repository server speaking KServe V2 over HTTP."""

from reposerve.errors import InvalidInput, ModelCallError

__all__ = ["InvalidInput", "ModelCallError"]
__version__ = "0.1.0"
