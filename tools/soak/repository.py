"""The soak's main repository: seven models, each with one way to fail."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tools.soak import sequences

POISON = 999.0
HANG = 13.0
ADDER = f"""
    from reposerve import InvalidInput

    class Model:
        def execute(self, inputs):
            if (inputs["INPUT"][:, 0] == {POISON}).any():
                raise InvalidInput("an item starts with the poison value {POISON:g}")
            return {{"OUTPUT": inputs["INPUT"] + 1}}
"""
HANGS = f"""
    import time

    class Model:
        def load(self, context):
            self.marker = context.version_path / "HANGING"

        def execute(self, inputs):
            if (inputs["INPUT"][:, 0] == {HANG}).any():
                self.marker.touch()
                while True:
                    time.sleep(1)
            return {{"OUTPUT": inputs["INPUT"]}}
"""
COUNTER = """
    import asyncio
    import numpy as np

    class Model:
        async def execute(self, inputs):
            for index in range(int(inputs["COUNT"][0])):
                await asyncio.sleep(0.005)
                yield {"INDEX": np.array([index], np.int32)}
"""
TENSORS = """
    max_batch_size = 8
    [[input]]
    name = "INPUT"
    datatype = "FP32"
    shape = [16]
    [[output]]
    name = "OUTPUT"
    datatype = "FP32"
    shape = [16]
"""
CONFIGS = {
    "adder": TENSORS + "[[instance_group]]\ncount = 2\n"
    "[dynamic_batching]\nmax_queue_delay_microseconds = 500\n",
    # No dynamic batching: a hung request runs alone, so it costs no neighbour.
    "hangs": TENSORS + "[[instance_group]]\ncount = 2\n[execution]\ntimeout_seconds = 1\n",
    "stuck": TENSORS + "[execution]\ntimeout_seconds = 0\n",
    "counter": """
        [[input]]
        name = "COUNT"
        datatype = "INT32"
        shape = [1]
        [[output]]
        name = "INDEX"
        datatype = "INT32"
        shape = [1]
    """,
}
RECURSE = """
    class Model:
        async def execute(self, inputs):
            return await self.context.infer("recurse", {"INPUT": inputs["INPUT"]})

        def load(self, context):
            self.context = context
"""
SINK = """
    class Model:
        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"][:1]}
"""
CHAIN = (
    'backend = "ensemble"\n'
    + TENSORS
    + '[[step]]\nmodel = "adder"\ninput_map = { INPUT = "INPUT" }\n'
    + 'output_map = { OUTPUT = "OUTPUT" }\n'
)
CONFIGS |= {
    "chain": CHAIN,
    "recurse": TENSORS,
    "sink": """
        max_batch_size = 0
        [[input]]
        name = "INPUT"
        datatype = "UINT8"
        shape = [-1]
        [[output]]
        name = "OUTPUT"
        datatype = "UINT8"
        shape = [1]
    """,
}
CONFIGS[sequences.MODEL] = sequences.CONFIG
CODE = {
    "adder": ADDER,
    "hangs": HANGS,
    "stuck": HANGS,
    "counter": COUNTER,
    "recurse": RECURSE,
    "sink": SINK,
    sequences.MODEL: sequences.CODE,
}
# chain's config with a second step that calls chain itself: a cycle, refused at load.
CYCLE = {
    "name": "chain",
    "platform": "ensemble",
    "max_batch_size": 8,
    "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [16]}],
    "ensemble_scheduling": {
        "step": [
            {"model_name": "adder", "model_version": -1, "input_map": {"INPUT": "INPUT"},
             "output_map": {"OUTPUT": "mid"}},
            {"model_name": "chain", "model_version": -1, "input_map": {"INPUT": "mid"},
             "output_map": {"OUTPUT": "OUTPUT"}},
        ]
    },
}  # fmt: skip
# Load overrides of adder that are wrong in their shape, each a 400 naming the field.
MALFORMED_OVERRIDES = [
    {"input": {"name": "INPUT"}},
    {"instance_group": [{"count": "two"}]},
    {"dynamic_batching": 5},
    {"version_policy": "latest"},
    {"max_batch_size": 1.5},
    {"input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [[16]]}]},
]


def write_repository(root: Path) -> None:
    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.toml").write_text(textwrap.dedent(config))
        if name in CODE:  # an ensemble has no code
            (root / name / "1" / "model.py").write_text(textwrap.dedent(CODE[name]))
