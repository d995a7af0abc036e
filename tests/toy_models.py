"""Toy models the tests share: each writes a model folder into a repository."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_model(root: Path, name: str, config: str, code: str | None, version: int = 1) -> Path:
    folder = root / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(textwrap.dedent(config))
    if code is not None:
        (folder / str(version) / "model.py").write_text(textwrap.dedent(code))
    return folder


def vector_config(
    datatype: str = "FP32",
    size: int = 16,
    max_batch: int = 8,
    extra: str = "",
    output: tuple[str, int] | None = None,
) -> str:
    """INPUT and OUTPUT vectors of ``size``; ``output`` = (datatype, size) when they differ."""
    output_datatype, output_size = output or (datatype, size)
    return f"""
        max_batch_size = {max_batch}
        [[input]]
        name = "INPUT"
        datatype = "{datatype}"
        shape = [{size}]
        [[output]]
        name = "OUTPUT"
        datatype = "{output_datatype}"
        shape = [{output_size}]
        {extra}
    """


PLUS_ONE = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 1}
"""

# Reports the pid of the instance that ran each item, to see requests spread.
PID = """
    import os
    import numpy as np

    class Model:
        def execute(self, inputs):
            batch = inputs["INPUT"].shape[0]
            return {"OUTPUT": np.full((batch, 1), os.getpid(), dtype=np.int64)}
"""

SLOW = """
    import time

    class Model:
        def execute(self, inputs):
            time.sleep(0.05)
            return {"OUTPUT": inputs["INPUT"] * 2}
"""

ASYNC_SLEEP = """
    import asyncio

    class Model:
        async def execute(self, inputs):
            await asyncio.sleep(0.2)
            return {"OUTPUT": inputs["INPUT"] * 2}
"""

# Raises for any batch holding a negative value, so one bad request fails alone.
ERROR = """
    class Model:
        def execute(self, inputs):
            if (inputs["INPUT"] < 0).any():
                raise ValueError("negative input is not allowed")
            return {"OUTPUT": inputs["INPUT"]}
"""

# Exits the process when asked, to show a dead instance fails only its own batch.
CRASH = """
    import os

    class Model:
        def execute(self, inputs):
            if (inputs["INPUT"] == 666).any():
                os._exit(3)
            return {"OUTPUT": inputs["INPUT"]}
"""
