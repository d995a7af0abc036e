"""Phase 2, precision: a ResNet-18 ``.pt2`` (weights=None) served at fp32, bf16 (and fp16
on a GPU) equals a direct run in this process under the same ``torch.autocast``, and bf16
differs from fp32."""

from __future__ import annotations

import os
import time

import numpy as np

from tools.gpu_check.context import Run
from tools.gpu_check.models import (
    autocast,
    export_program,
    groups,
    image_config,
    image_request,
    load_program,
    write_model,
)
from tools.gpu_check.report import Phase


def precision(run: Run, phase: Phase) -> None:
    import torch

    node = run.node
    if run.gpu_unusable(phase, "precision on the GPU"):
        return
    device = "cuda" if node.gpus else "cpu"
    precisions = ["fp32", "bf16", "fp16"] if device == "cuda" else ["fp32", "bf16"]
    if device == "cpu":
        phase.skip_part("fp16", f"checked on a GPU only ({node.no_gpu_reason})")
    placed = groups("gpu", 1, [0]) if device == "cuda" else groups("cpu", 1)
    program = run.workdir / "exports" / "resnet18.pt2"
    with phase.timed("export"):
        export_program("resnet18", program)
    root = run.repository("precision")
    for name in precisions:
        version = write_model(root, f"resnet18_{name}", image_config(8, name) + placed)
        os.link(program, version / "model.pt2")
    with phase.timed("server ready"):
        server = run.serve("precision", root)

    # Two images are enough to compare; a CPU takes seconds per ResNet-18 batch.
    count = 4 if device == "cuda" else 2
    images = np.random.default_rng(0).standard_normal((count, 3, 224, 224)).astype(np.float32)
    served: dict[str, np.ndarray] = {}
    started = time.monotonic()
    with server.triton() as client:
        for name in precisions:
            inputs, wanted = image_request(images)
            result = client.infer(f"resnet18_{name}", inputs, outputs=wanted)
            served[name] = result.as_numpy("OUTPUT")
    phase.facts.setdefault("timings_s", {})["served runs"] = round(time.monotonic() - started, 2)

    # The same run in this process: the backend's settings (IEEE fp32, no cuDNN timing).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    with phase.timed("direct load"):
        module = load_program(program, device)
    direct: dict[str, np.ndarray] = {}
    with phase.timed("direct runs"), torch.inference_mode():
        for name in precisions:
            with autocast(device, name):
                output = module(torch.from_numpy(images).to(device))
            direct[name] = output.float().cpu().numpy()
    del module

    scale = float(np.abs(direct["fp32"]).max())

    def diff(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.abs(a.astype(np.float64) - b).max())

    results: dict[str, dict[str, float]] = {}
    for name in precisions:
        results[name] = {
            "max_abs_diff_vs_direct_same_precision": diff(served[name], direct[name]),
            "max_abs_diff_vs_direct_fp32": diff(served[name], direct["fp32"]),
            "max_abs_diff_vs_served_fp32": diff(served[name], served["fp32"]),
            "top1_agreement_with_fp32": float(
                np.mean(served[name].argmax(1) == direct["fp32"].argmax(1))
            ),
        }
    phase.facts.update(device=device, output_scale=scale, per_precision=results)
    same = results["fp32"]["max_abs_diff_vs_direct_same_precision"]
    phase.check(
        "fp32: served equals the direct run",
        same <= 1e-4 * scale,
        f"max |diff| {same:.3g} (limit 1e-4 x scale {scale:.3g})",
    )
    for name in precisions[1:]:
        found = results[name]
        same = found["max_abs_diff_vs_direct_same_precision"]
        apart = found["max_abs_diff_vs_direct_fp32"]
        phase.check(
            f"{name}: served equals the direct autocast run",
            same <= 1e-2 * scale and same < apart,
            f"max |diff| {same:.3g} (limit 1e-2 x scale {scale:.3g}, and below {apart:.3g}, "
            "its distance from fp32)",
        )
        phase.check(
            f"{name}: differs from fp32",
            found["max_abs_diff_vs_served_fp32"] > 1e-6 * scale,
            f"max |served {name} - served fp32| {found['max_abs_diff_vs_served_fp32']:.3g}",
        )
    parts = [f"fp32 {results['fp32']['max_abs_diff_vs_direct_same_precision']:.2g}"] + [
        f"{name} {results[name]['max_abs_diff_vs_direct_same_precision']:.2g} "
        f"(its distance from fp32 {results[name]['max_abs_diff_vs_direct_fp32']:.2g})"
        for name in precisions[1:]
    ]
    phase.headline = f"{device}, max |served - direct| " + ", ".join(parts) + f", scale {scale:.3g}"
