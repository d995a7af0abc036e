"""The models the phases serve, and how to make them: the probe and fault sources (python
backend), their configs, torchvision exports for the image models, and the same programs
loaded here for direct runs."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

if TYPE_CHECKING:
    from tritonclient.http import InferInput, InferRequestedOutput


def signature(
    input_datatype: str, input_shape: list[int], output: str, datatype: str, shape: list[int]
) -> str:
    """The config.toml lines of a model's one input, ``INPUT``, and its one output."""
    return (
        f'[[input]]\nname = "INPUT"\ndatatype = "{input_datatype}"\nshape = {input_shape}\n'
        f'[[output]]\nname = "{output}"\ndatatype = "{datatype}"\nshape = {shape}\n'
    )


def groups(kind: str, count: int = 1, gpus: list[int] | None = None) -> str:
    listed = f"\ngpus = {gpus}" if gpus is not None else ""
    return f'[[instance_group]]\nkind = "{kind}"\ncount = {count}{listed}\n'


def image_config(max_batch: int, precision: str) -> str:
    """An exported torchvision classifier: 224 x 224 images in, 1000 logits out."""
    return (
        f"max_batch_size = {max_batch}\n"
        + signature("FP32", [3, 224, 224], "OUTPUT", "FP32", [1000])
        + f'[optimization]\nprecision = "{precision}"\n'
    )


def image_request(images: np.ndarray) -> tuple[list[InferInput], list[InferRequestedOutput]]:
    """``images`` as an image model's binary ``INPUT``, asking for ``OUTPUT`` in binary."""
    import tritonclient.http as triton

    tensor = triton.InferInput("INPUT", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images, binary_data=True)
    return [tensor], [triton.InferRequestedOutput("OUTPUT", binary_data=True)]


def write_model(root: Path, name: str, config: str, code: str | None = None) -> Path:
    """A model folder; returns its version folder (1/), where a model file goes."""
    version = root / name / "1"
    version.mkdir(parents=True)
    (root / name / "config.toml").write_text(textwrap.dedent(config))
    if code is not None:
        (version / "model.py").write_text(textwrap.dedent(code))
    return version


def instance_facts(version: Path) -> list[dict[str, Any]]:
    """What each instance of a PROBE or FAULTS model wrote at load, oldest first."""
    files = sorted((version / "instances").glob("*.json"), key=lambda path: path.stat().st_mtime)
    return [msgspec.json.decode(path.read_bytes()) for path in files]


# The probe and fault models take one INT32 flag per item (``Server.infer_flag``).
FLAG_MODEL = 'backend = "python"\nmax_batch_size = 8\n'

# Reports where it runs: at load into instances/<pid>.json beside model.py (so that every
# instance is seen, not just those requests reach), and in answer to a request as BYTES.
# ``[parameters] hold_gib`` makes it hold that much memory, touched: device memory on a GPU,
# RAM on the CPU.
PROBE = """
    import json
    import os

    import numpy as np


    class Model:
        def load(self, context):
            facts = {
                "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "device": context.device,
                "instance_index": context.instance_index,
            }
            hold = int(float(context.config.parameters.get("hold_gib", 0)) * 2**30)
            if context.device.startswith("cuda"):
                import torch

                properties = torch.cuda.get_device_properties(0)
                facts.update(
                    uuid=str(properties.uuid),
                    name=properties.name,
                    device_count=torch.cuda.device_count(),
                )
                # A context and a little memory, so that nvidia-smi lists this process.
                self.held = torch.ones(max(hold, 2**20), dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
            elif hold:
                self.held = np.ones(hold, dtype=np.uint8)
            folder = context.version_path / "instances"
            folder.mkdir(exist_ok=True)
            (folder / f"{os.getpid()}.json").write_text(json.dumps(facts))
            self.facts = json.dumps(facts).encode()

        def execute(self, inputs):
            batch = inputs["INPUT"].shape[0]
            return {"FACTS": np.array([[self.facts]] * batch, dtype=object)}
"""
PROBE_CONFIG = FLAG_MODEL + signature("INT32", [1], "FACTS", "BYTES", [1])
OOM, ASSERT = 1, 2
# Answers its pid after a small computation on its GPU; flag OOM asks for four times the
# GPU's memory (torch.OutOfMemoryError), flag ASSERT indexes a CUDA tensor out of bounds (a
# device-side assert, which poisons the process's CUDA context; the pid goes to asserted.txt
# first, since the failed request cannot carry it).
FAULTS = f"""
    import json
    import os

    import numpy as np
    import torch


    class Model:
        def load(self, context):
            self.folder = context.version_path / "instances"
            self.folder.mkdir(exist_ok=True)
            self.ones = torch.ones(1024, device="cuda")
            (self.folder / f"{{os.getpid()}}.json").write_text(json.dumps({{"pid": os.getpid()}}))

        def execute(self, inputs):
            flag = int(inputs["INPUT"].max())
            if flag == {OOM}:
                total = torch.cuda.get_device_properties(0).total_memory
                torch.empty(4 * total, dtype=torch.uint8, device="cuda")
            if flag == {ASSERT}:
                (self.folder / "asserted.txt").write_text(str(os.getpid()))
                torch.zeros(1, device="cuda")[torch.tensor([5], device="cuda")]
                torch.cuda.synchronize()
            assert float((self.ones * 2).sum()) == 2048.0
            return {{"OUTPUT": np.full((inputs["INPUT"].shape[0], 1), os.getpid(), np.int64)}}
"""
FAULTS_CONFIG = FLAG_MODEL + signature("INT32", [1], "OUTPUT", "INT64", [1])


def export_program(arch: str, path: Path) -> None:
    """torchvision's ``arch`` with weights=None (seed 0) exported with a dynamic batch."""
    import warnings

    import torch
    import torchvision

    torch.manual_seed(0)
    module = getattr(torchvision.models, arch)(weights=None).eval()
    batch = torch.export.Dim("batch", min=1, max=256)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notices are not ours to fix
        program = torch.export.export(
            module, (torch.zeros(2, 3, 224, 224),), dynamic_shapes={"x": {0: batch}}
        )
    torch.export.save(program, str(path))


def load_program(path: Path, device: str) -> Any:
    """The exported module on ``device``, moved as the torch backend moves it."""
    import torch
    from torch.export.passes import move_to_device_pass

    return move_to_device_pass(torch.export.load(str(path)), torch.device(device)).module()


def autocast(device: str, precision: str) -> Any:
    import contextlib

    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return torch.autocast(device, dtype=dtype)
