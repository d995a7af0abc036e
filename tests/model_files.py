"""Small real models made in the test run: one network exported to ONNX, TorchScript and
torch.export, so every backend can be checked against a direct run of the same weights."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed")

# How far a run at each compute precision may stray from the fp32 reference.
TOLERANCE = {"fp32": 1e-5, "fp16": 2e-2, "bf16": 8e-2}


class TinyNet(torch.nn.Module):
    """x: FP32 [batch, 4] -> y: FP32 [batch, 3]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden = torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def tiny_net() -> TinyNet:
    return TinyNet().eval()


def reference(values: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return tiny_net()(torch.from_numpy(values)).numpy()


def _example() -> torch.Tensor:
    return torch.zeros(2, 4)


def export_onnx(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation notices are not ours
        torch.onnx.export(
            tiny_net(),
            (_example(),),
            str(path),
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
            dynamo=False,
        )


class TokenNet(torch.nn.Module):
    """ids, mask: INT64 [batch, length] -> hidden: FP32 [batch, length, 8], each token's
    own, and pooled: FP32 [batch, 8], their mean under the mask. Padding changes neither."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 8)
        self.mix = torch.nn.Linear(8, 8)

    def forward(self, ids, mask):
        hidden = torch.tanh(self.mix(self.embed(ids)))
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return hidden, (hidden * weights).sum(1) / weights.sum(1)


def token_reference(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TokenNet on ``ids`` alone, unpadded."""
    mask = torch.ones(ids.shape, dtype=torch.int64)
    with torch.inference_mode():
        hidden, pooled = TokenNet().eval()(torch.from_numpy(ids), mask)
    return hidden.numpy(), pooled.numpy()


def export_token_net(path: Path) -> None:
    """TokenNet as ONNX (model.onnx) or TorchScript (model.pt), by ``path``'s suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    example = (torch.ones(2, 5, dtype=torch.int64), torch.ones(2, 5, dtype=torch.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if path.suffix == ".pt":
            torch.jit.trace(TokenNet().eval(), example).save(str(path))
            return
        varying = {0: "batch", 1: "length"}
        torch.onnx.export(
            TokenNet().eval(),
            example,
            str(path),
            input_names=["ids", "mask"],
            output_names=["hidden", "pooled"],
            dynamic_axes={
                "ids": varying,
                "mask": varying,
                "hidden": varying,
                "pooled": {0: "batch"},
            },
            dynamo=False,
        )


def export_torchscript(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(tiny_net(), (_example(),)).save(str(path))


def export_program(path: Path) -> None:
    _export(tiny_net(), _example(), path)


def bf16_net() -> TinyNet:
    """TinyNet in bfloat16 throughout: x: BF16 [batch, 4] -> y: BF16 [batch, 3]."""
    return tiny_net().to(torch.bfloat16)


def export_bf16_program(path: Path) -> None:
    _export(bf16_net(), _example().to(torch.bfloat16), path)


def reference_bf16(bits: np.ndarray) -> np.ndarray:
    """``bf16_net`` on bfloat16 bit patterns (uint16), returning bit patterns."""
    with torch.inference_mode():
        result = bf16_net()(torch.from_numpy(bits).view(torch.bfloat16))
        return result.view(torch.uint16).numpy()


def _export(module: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1, max=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(module, (example,), dynamic_shapes={"x": {0: batch}})
        torch.export.save(program, str(path))
