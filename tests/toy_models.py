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


# A text generator's tensors in Triton's text format (the OpenAI routes' defaults).
TEXT_IN_OUT = """\
[[input]]
name = "text_input"
datatype = "BYTES"
shape = [1]
[[output]]
name = "text_output"
datatype = "BYTES"
shape = [1]
"""


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


def vector_body(first: float, size: int = 4) -> dict:
    """A V2 JSON request for a ``vector_config`` model: one item, [first, 1, 2, ...]."""
    data = [first] + [float(i) for i in range(1, size)]
    return {"inputs": [{"name": "INPUT", "shape": [1, size], "datatype": "FP32", "data": data}]}


# Every reposerve setting Triton's schema has no field for, and some of each kind that it has.
EVERY_SETTING = "version_policy = { all = true }\n" + vector_config(
    extra="""
    [[instance_group]]
    kind = "cpu"
    count = 2
    cpus = [0]
    [dynamic_batching]
    preferred_batch_size = [2, 4]
    max_queue_delay_microseconds = 300
    max_queue_size = 9
    default_timeout_microseconds = 5000000
    priority_levels = 2
    default_priority_level = 1
    [optimization]
    precision = "fp16"
    [execution]
    timeout_seconds = 30.5
    isolate_failures = false
    [lifecycle]
    pinned = true
    [[warmup]]
    batch_size = 2
    inputs = { INPUT = "random" }
    [parameters]
    max_inflight_batches = 2
    note = "3"
    label = "plain text"
    table = { a = 1, b = [true, "x"] }
    """
)


def ensemble_head(max_batch: int) -> str:
    """An ensemble's config.toml before its [[step]]s: FP32 [4] from IN to OUT."""
    return f"""
    backend = "ensemble"
    max_batch_size = {max_batch}
    [[input]]
    name = "IN"
    datatype = "FP32"
    shape = [4]
    [[output]]
    name = "OUT"
    datatype = "FP32"
    shape = [4]
"""


PLUS_ONE = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"] + 1}
"""

# Steps that ensembles chain and models call: FP32 [4] from X to Y, batched within 20 ms.
XY_CONFIG = """
    max_batch_size = 16
    [[input]]
    name = "X"
    datatype = "FP32"
    shape = [4]
    [[output]]
    name = "Y"
    datatype = "FP32"
    shape = [4]
    [dynamic_batching]
    max_queue_delay_microseconds = 20000
"""
XY_PLUS_ONE = """
    class Model:
        def execute(self, inputs):
            return {"Y": inputs["X"] + 1}
"""
XY_DOUBLE = """
    class Model:
        def execute(self, inputs):
            return {"Y": inputs["X"] * 2}
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

# Each execute waits until 16 are running at once (for 60 s at most, then fails): only an
# instance that runs executes together answers 16 requests.
ASYNC_GATHER = """
    import asyncio

    class Model:
        def load(self, context):
            self.running = 0
            self.all_in = asyncio.Event()

        async def execute(self, inputs):
            self.running += 1
            if self.running >= 16:
                self.all_in.set()
            await asyncio.wait_for(self.all_in.wait(), 60)
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

# The first value of each item decides: -1 is bad input (reposerve.InvalidInput, a 400),
# -2 a model failure (a plain exception, a 500); anything else is answered x + 1.
PICKY = """
    import numpy as np
    from reposerve import InvalidInput

    class Model:
        def execute(self, inputs):
            firsts = inputs["INPUT"][:, 0]
            if (firsts == -1).any():
                raise InvalidInput("an item starts with -1, which this model cannot read")
            if (firsts == -2).any():
                raise ValueError("an item starts with -2")
            return {"OUTPUT": inputs["INPUT"] + 1}
"""

# Hangs for good on an item starting with 13 (and says so with a file HANGING beside
# model.py); answers x otherwise.
HANGS = """
    import time

    class Model:
        def load(self, context):
            self.marker = context.version_path / "HANGING"

        def execute(self, inputs):
            if (inputs["INPUT"][:, 0] == 13).any():
                self.marker.touch()
                while True:
                    time.sleep(1)
            return {"OUTPUT": inputs["INPUT"]}
"""

# Dies on 666; once the file CRASH_ON_LOAD exists beside model.py, dies while loading too.
CRASH_LOOP = """
    import os
    from pathlib import Path

    class Model:
        def load(self, context):
            if (context.version_path / "CRASH_ON_LOAD").exists():
                os._exit(4)

        def execute(self, inputs):
            if (inputs["INPUT"] == 666).any():
                os._exit(3)
            return {"OUTPUT": inputs["INPUT"]}
"""

# Dies on 666 two seconds after saying so (a file DYING beside model.py); once the file
# SLOW_LOAD exists there, takes 30 s to load.
SLOW_RESTART = """
    import os
    import time

    class Model:
        def load(self, context):
            self.folder = context.version_path
            if (self.folder / "SLOW_LOAD").exists():
                time.sleep(30)

        def execute(self, inputs):
            if (inputs["INPUT"] == 666).any():
                (self.folder / "DYING").touch()
                time.sleep(2)  # let requests queue behind this one
                os._exit(3)
            return {"OUTPUT": inputs["INPUT"]}
"""

# Appends "pid batch-size" to EXECUTED beside model.py for every batch it runs.
RECORDS = """
    import os

    class Model:
        def load(self, context):
            self.log = context.version_path / "EXECUTED"

        def execute(self, inputs):
            with open(self.log, "a") as log:
                log.write(f"{os.getpid()} {inputs['INPUT'].shape[0]}\\n")
            return {"OUTPUT": inputs["INPUT"]}
"""

# Fails the way torch reports device errors, for items starting with -7 (a CUDA error that
# poisons the process) or -8 (out of device memory); otherwise answers its pid per value.
DEVICE_FAULTS = """
    import os
    import numpy as np

    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError, by name and words
        pass

    class Model:
        def execute(self, inputs):
            first = inputs["INPUT"][:, 0]
            if (first == -7).any():
                raise RuntimeError(
                    "CUDA error: device-side assert triggered\\n"
                    "CUDA kernel errors might be asynchronously reported at some other API call"
                )
            if (first == -8).any():
                raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return {"OUTPUT": np.full(inputs["INPUT"].shape, os.getpid(), np.float32)}
"""

# The request starting with 1 waits for GO beside model.py, then answers whether the next
# batch's frame reached this process while it ran (1.0) or not within a second (0.0).
STAGING_PROBE = """
    import select
    import sys
    import time
    import numpy as np

    class Model:
        def load(self, context):
            self.folder = context.version_path

        def execute(self, inputs):
            values = inputs["INPUT"]
            if values[0, 0] != 1:
                return {"OUTPUT": values}
            (self.folder / "RUNNING").touch()
            while not (self.folder / "GO").exists():
                time.sleep(0.01)
            socket_fd = int(sys.orig_argv[-1])  # the worker's channel (models see argv [""])
            waiting, _, _ = select.select([socket_fd], [], [], 1.0)
            return {"OUTPUT": np.full(values.shape, float(bool(waiting)), np.float32)}
"""

# Takes 3 s to unload, as a process tearing down a large CUDA context does.
# Its unload says it began (TEARDOWN) and lasts until a file GO appears (60 s at most).
SLOW_TEARDOWN = """
    import time

    class Model:
        def load(self, context):
            self.folder = context.version_path

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"]}

        def unload(self):
            (self.folder / "TEARDOWN").touch()
            deadline = time.monotonic() + 60
            while not (self.folder / "GO").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
"""


# Decoupled: yields OUT = 0, 1, ... COUNT - 1 (and BLOB, SIZE bytes), each after DELAY s,
# and raises after three responses when SIZE is 3. Counts what it yields in a log file and
# notes how it was stopped: a cancel reaches a sync generator as GeneratorExit at its yield.
COUNTING_SYNC = """
    import time
    from pathlib import Path
    import numpy as np

    class Model:
        def load(self, context):
            self.log = Path(context.config.parameters["log"])

        def execute(self, inputs):
            count = int(inputs["COUNT"][0])
            try:
                for index in range(count):
                    time.sleep(float(inputs["DELAY"][0]))
                    with self.log.open("a") as log:
                        log.write("yield\\n")
                    yield {"OUT": np.full([1], index, np.int32),
                           "BLOB": np.array([b"x" * int(inputs["SIZE"][0])], dtype=object)}
                    if index == 2 and int(inputs["SIZE"][0]) == 3:
                        raise ValueError("fails after three responses")
            except GeneratorExit:
                with self.log.open("a") as log:
                    log.write("cancelled\\n")
                raise
"""

# The same as an async generator: a cancel arrives as CancelledError where it awaits, or
# as GeneratorExit at its yield when it was held there (a slow client).
COUNTING_ASYNC = """
    import asyncio
    from pathlib import Path
    import numpy as np

    class Model:
        def load(self, context):
            self.log = Path(context.config.parameters["log"])

        async def execute(self, inputs):
            count = int(inputs["COUNT"][0])
            try:
                for index in range(count):
                    await asyncio.sleep(float(inputs["DELAY"][0]))
                    with self.log.open("a") as log:
                        log.write("yield\\n")
                    yield {"OUT": np.full([1], index, np.int32),
                           "BLOB": np.array([b"x" * int(inputs["SIZE"][0])], dtype=object)}
                    if index == 2 and int(inputs["SIZE"][0]) == 3:
                        raise ValueError("fails after three responses")
            except (asyncio.CancelledError, GeneratorExit):
                with self.log.open("a") as log:
                    log.write("cancelled\\n")
                raise
"""


def counting_config(log: Path) -> str:
    return f"""
        [[input]]
        name = "COUNT"
        datatype = "INT32"
        shape = [1]
        [[input]]
        name = "DELAY"
        datatype = "FP32"
        shape = [1]
        [[input]]
        name = "SIZE"
        datatype = "INT32"
        shape = [1]
        [[output]]
        name = "OUT"
        datatype = "INT32"
        shape = [1]
        [[output]]
        name = "BLOB"
        datatype = "BYTES"
        shape = [1]
        [parameters]
        log = "{log}"
    """


# Triton's simple_string example model, for its shared-memory examples.
SIMPLE_STRING_CONFIG = """
    max_batch_size = 8
    [[input]]
    name = "INPUT0"
    datatype = "BYTES"
    shape = [16]
    [[input]]
    name = "INPUT1"
    datatype = "BYTES"
    shape = [16]
    [[output]]
    name = "OUTPUT0"
    datatype = "BYTES"
    shape = [16]
    [[output]]
    name = "OUTPUT1"
    datatype = "BYTES"
    shape = [16]
"""
# Triton's simple_string: integers as strings in, their sum and difference as strings out.
SIMPLE_STRING = """
    import numpy as np

    def ints(values):
        return np.array([int(v) for v in values.flat], dtype=np.int64).reshape(values.shape)

    def text(values):
        return np.array([str(v).encode() for v in values.flat], dtype=object).reshape(
            values.shape
        )

    class Model:
        def execute(self, inputs):
            a, b = ints(inputs["INPUT0"]), ints(inputs["INPUT1"])
            return {"OUTPUT0": text(a + b), "OUTPUT1": text(a - b)}
"""
# Says it started (STARTED beside model.py), then holds its request until GO appears.
GATED = """
    import time

    class Model:
        def load(self, context):
            self.folder = context.version_path

        def execute(self, inputs):
            (self.folder / "STARTED").touch()
            deadline = time.monotonic() + 60
            while not (self.folder / "GO").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return {"OUTPUT": inputs["INPUT"] * 2}
"""
