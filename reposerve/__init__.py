"""reposerve: a config-driven model repository server speaking KServe V2 over HTTP."""

__version__ = "0.1.0"
