"""The torch backend: ``N/model.pt`` (TorchScript) or ``N/model.pt2`` (torch.export).

Inputs are passed positionally in config order; a model returning one tensor, a tuple or
a dict maps onto the outputs in config order (or by name for a dict). A ``.pt2`` file
carries its tensors' dtypes and shapes, so config.toml may omit them; TorchScript does
not, so it must declare them. ``precision`` casts the model's float parameters and float
inputs; outputs come back in their declared datatypes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reposerve.backends.base import Arrays, BackendError, ModelContext, Signature
from reposerve.config import TensorConfig

SCRIPT_FILE = "model.pt"
EXPORT_FILE = "model.pt2"


class TorchBackend:
    is_async = False

    def __init__(self, context: ModelContext) -> None:
        try:
            import torch
        except ImportError as exc:
            raise BackendError(
                "the torch backend needs the torch extra: pip install 'reposerve[torch]'"
            ) from exc
        self._torch = torch
        torch.set_num_threads(context.threads)
        self._device = torch.device(context.device)
        if self._device.type == "cuda" and not torch.cuda.is_available():
            raise BackendError(
                f"{context.model_name}: this torch build cannot use the GPU "
                f"(torch {torch.__version__}, CUDA available: no)"
            )
        self._dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[
            context.config.optimization.precision
        ]
        config = context.config
        exported = context.version_path / EXPORT_FILE
        self._signature: Signature | None = None
        if exported.is_file():
            program = torch.export.load(str(exported))
            self._signature = _rename(
                _program_signature(program, torch), config.input, config.output
            )
            module = program.module()
        else:
            if not (config.input and config.output):
                raise BackendError(
                    f"{context.model_name}: TorchScript files carry no tensor names or shapes; "
                    "declare [[input]] and [[output]] in config.toml (or export with "
                    "torch.export to model.pt2)"
                )
            module = torch.jit.load(str(context.version_path / SCRIPT_FILE), map_location="cpu")
        module = module.to(self._device)
        if self._dtype is not None:
            module = module.to(self._dtype)
        self._module = module
        inputs, outputs = self._signature or (config.input, config.output)
        self._inputs = [tensor.name for tensor in inputs]
        # The config may declare a subset of the file's outputs, as in Triton.
        declared = {tensor.name for tensor in config.output}
        self._outputs = [tensor.name for tensor in outputs]
        self._delivered = [name for name in self._outputs if not declared or name in declared]

    def signature(self) -> Signature | None:
        return self._signature

    def execute(self, inputs: Arrays) -> Arrays:
        torch = self._torch
        with torch.inference_mode():
            arguments = [self._to_torch(inputs[name]) for name in self._inputs]
            result = self._module(*arguments)
        if isinstance(result, torch.Tensor):
            result = (result,)
        if not isinstance(result, dict):
            result = dict(zip(self._outputs, result, strict=False))
        return {name: self._to_numpy(result[name]) for name in self._delivered if name in result}

    def unload(self) -> None:
        del self._module

    def _to_torch(self, array: np.ndarray) -> Any:
        tensor = self._torch.from_numpy(array).to(self._device)
        if self._dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(self._dtype)
        return tensor

    def _to_numpy(self, tensor: Any) -> np.ndarray:
        if tensor.dtype in (self._torch.float16, self._torch.bfloat16) and self._dtype is not None:
            tensor = tensor.float()  # computed at reduced precision; delivered as declared
        return tensor.detach().cpu().numpy()


def _datatypes(torch: Any) -> dict[Any, str]:
    return {
        torch.bool: "BOOL",
        torch.uint8: "UINT8",
        torch.int8: "INT8",
        torch.int16: "INT16",
        torch.int32: "INT32",
        torch.int64: "INT64",
        torch.float16: "FP16",
        torch.float32: "FP32",
        torch.float64: "FP64",
        torch.bfloat16: "BF16",
    }


def _program_signature(program: Any, torch: Any) -> Signature:
    """Tensors of an ExportedProgram from its example values; dynamic dimensions are -1."""
    datatypes = _datatypes(torch)
    graph_signature = program.graph_signature
    values = {node.name: node.meta.get("val") for node in program.graph.nodes}
    # The output node returns buffer mutations first, then the user's outputs.
    returned = next(node for node in program.graph.nodes if node.op == "output").args[0]
    user_returned = list(returned)[len(returned) - len(graph_signature.user_outputs) :]
    for name, node in zip(graph_signature.user_outputs, user_returned, strict=True):
        values[name] = node.meta.get("val")

    def describe(name: str) -> TensorConfig:
        value = values.get(name)
        if value is None or value.dtype not in datatypes:
            raise BackendError(f"{EXPORT_FILE}: tensor '{name}' has no dtype V2 can carry")
        shape = [dim if isinstance(dim, int) else -1 for dim in value.shape]
        return TensorConfig(name=name, datatype=datatypes[value.dtype], shape=shape)

    inputs = [describe(name) for name in graph_signature.user_inputs]
    outputs = [describe(name) for name in graph_signature.user_outputs]
    return inputs, outputs


def _rename(
    signature: Signature, inputs: list[TensorConfig], outputs: list[TensorConfig]
) -> Signature:
    """Torch tensors are positional: declared names replace the file's, position by position."""
    return (
        _renamed("inputs", signature[0], inputs),
        _renamed("outputs", signature[1], outputs),
    )


def _renamed(
    section: str, found: list[TensorConfig], declared: list[TensorConfig]
) -> list[TensorConfig]:
    if not declared:
        return found
    if len(declared) != len(found):
        raise BackendError(
            f"config.toml declares {len(declared)} {section}, the model file has {len(found)}"
        )
    return [
        TensorConfig(name=mine.name, datatype=theirs.datatype, shape=theirs.shape)
        for mine, theirs in zip(declared, found, strict=True)
    ]
