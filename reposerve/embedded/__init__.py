"""The server embedded in a Python process: ``reposerve.Server`` (see ``server``)."""

from reposerve.embedded.server import Server
from reposerve.embedded.tensors import InferResult

__all__ = ["InferResult", "Server"]
