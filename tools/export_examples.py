"""Create the ResNet-50 examples of model_repository/ from torchvision, with weights=None.

Nothing is downloaded: the weights are torchvision's random initialisation under a fixed
seed, so every export (and the image_classifier model) computes the same function.

    python tools/export_examples.py [--repository model_repository] [--force]

Writes resnet50_torch/ (TorchScript) and resnet50_onnx/ (ONNX), each with its config.toml,
and image_pipeline/, the ensemble preprocess -> resnet50_onnx -> postprocess (its steps
preprocess and postprocess are in the repository already); existing ones are kept unless
--force.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import warnings
from pathlib import Path

CONFIG = """\
# ResNet-50 (torchvision, weights=None, seed 0) exported by tools/export_examples.py.
max_batch_size = 16
# Inputs and outputs come from the model file (auto-complete).

[dynamic_batching]
preferred_batch_size = [8, 16]
max_queue_delay_microseconds = 5000
"""


def resnet50():
    import torch
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval()


def export_torch(folder: Path) -> None:
    import torch

    example = torch.zeros(2, 3, 224, 224)
    (folder / "1").mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(resnet50(), (example,)).save(str(folder / "1" / "model.pt"))
    (folder / "config.toml").write_text(
        CONFIG.replace("# Inputs and outputs come from the model file (auto-complete).\n", "")
        + textwrap.dedent("""
            [[input]]
            name = "input"
            datatype = "FP32"
            shape = [3, 224, 224]

            [[output]]
            name = "logits"
            datatype = "FP32"
            shape = [1000]
        """)
    )


def export_onnx(folder: Path) -> None:
    import torch

    example = torch.zeros(2, 3, 224, 224)
    (folder / "1").mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            resnet50(),
            (example,),
            str(folder / "1" / "model.onnx"),
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            dynamo=False,
        )
    (folder / "config.toml").write_text(CONFIG)


PIPELINE = """\
# JPEG bytes -> the five likeliest ImageNet classes, as three models each with its own
# instances and batching: preprocess (decode, two CPU instances) -> resnet50_onnx (dynamic
# batching) -> postprocess (softmax, top five). Written by tools/export_examples.py.
backend = "ensemble"
max_batch_size = 16

[[input]]
name = "IMAGE"
datatype = "BYTES"
shape = [1]

[[output]]
name = "CLASS_IDS"
datatype = "INT64"
shape = [5]

[[output]]
name = "SCORES"
datatype = "FP32"
shape = [5]

[[step]]
model = "preprocess"
input_map = { IMAGE = "IMAGE" }
output_map = { PIXELS = "pixels" }

[[step]]
model = "resnet50_onnx"
input_map = { input = "pixels" }
output_map = { logits = "logits" }

[[step]]
model = "postprocess"
input_map = { LOGITS = "logits" }
output_map = { CLASS_IDS = "CLASS_IDS", SCORES = "SCORES" }
"""


def write_pipeline(folder: Path) -> None:
    (folder / "1").mkdir(parents=True, exist_ok=True)  # an ensemble's version: no file
    (folder / "config.toml").write_text(PIPELINE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("export_examples: torch is not installed (pip install 'reposerve[torch]'); skipped")
        return 0
    for name, export in (
        ("resnet50_torch", export_torch),
        ("resnet50_onnx", export_onnx),
        ("image_pipeline", write_pipeline),
    ):
        folder = args.repository / name
        if (folder / "config.toml").exists() and not args.force:
            continue
        print(f"export_examples: writing {folder}")
        export(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
