"""The torch backend: ``N/model.pt`` (TorchScript) or ``N/model.pt2`` (torch.export).

Inputs are passed positionally in config order; a model returning one tensor, a tuple or
a dict maps onto the outputs in config order (or by name for a dict). A ``.pt2`` file
carries its tensors' dtypes and shapes, so config.toml may omit them; TorchScript does
not, so it must declare them.

Loading, in the instance process:

1. ``[parameters]`` options (``reposerve.config.torch_options``): ``allow_tf32``,
   ``cudnn_benchmark``, ``torch_compile``, checked when the config was read, as is what a
   TorchScript file cannot do. Checked here, needing torch: torch.compile's names.
2. fp32 math is IEEE: TF32 matmuls and cuDNN convolutions only with ``allow_tf32 = true``.
3. A ``.pt2`` program is moved with torch.export's ``move_to_device_pass`` before
   ``.module()``: it also rewrites devices baked into the graph, which ``Module.to`` cannot.
4. ``precision = "fp16" | "bf16"`` keeps the parameters as they are and runs ``execute``
   under ``torch.autocast``, which lowers matmuls and convolutions and keeps reductions
   and normalisation statistics in fp32. A device that cannot autocast to that dtype is
   a load error (no silent fp32, no blanket cast of BatchNorm statistics).
5. ``torch_compile`` wraps the module in ``torch.compile`` (compiled on the first batch of
   each shape: declare ``[[warmup]]``).

Per batch: BF16 inputs (uint16 bit patterns on the wire) become ``torch.bfloat16`` tensors;
inputs go to the device with non-blocking copies (asynchronous from the shared-memory
slots ``register_host_buffer`` pinned). Outputs are ``TorchOutput`` objects, already in
their declared datatype on the device, which the worker copies straight into the slot;
``synchronize`` waits for those copies.
"""

from __future__ import annotations

import contextlib
import mmap
import warnings
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
from msgspec import UNSET

from reposerve.backends.base import Arrays, BackendError, ModelContext, Outputs, Signature
from reposerve.config import TensorConfig
from reposerve.config.schema import Datatype
from reposerve.config.torch_options import CompileOptions, torch_options
from reposerve.datatypes import NUMPY_DTYPES
from reposerve.errors import ConfigError

SCRIPT_FILE = "model.pt"
EXPORT_FILE = "model.pt2"

DATATYPES: dict[torch.dtype, Datatype] = {
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
TORCH_DTYPES: dict[str, torch.dtype] = {datatype: dtype for dtype, datatype in DATATYPES.items()}
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Exponent bits: converting a float to one with at least as many only rounds, never
# overflows, so such outputs are converted on the device without a range check.
_EXPONENT_BITS = {torch.float16: 5, torch.bfloat16: 8, torch.float32: 8, torch.float64: 11}


class TorchOutput:
    """One output tensor, in its declared datatype, on the model's device (a DeviceOutput).

    A BF16 output stays a bfloat16 tensor; the slot holds its uint16 bit patterns, which
    the copy writes through a bfloat16 view of the target.
    """

    def __init__(self, tensor: torch.Tensor, dtype: np.dtype) -> None:
        self._tensor = tensor
        self.shape = tuple(tensor.shape)
        self.dtype = dtype

    def copy_into(self, target: np.ndarray) -> None:
        # From a GPU into pinned memory this only queues the copy; synchronize() waits.
        self._copy(target, non_blocking=True)

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        """The values on the host, for code that inspects outputs as numpy arrays."""
        if copy is False:
            raise ValueError("a torch output reaches numpy only as a copy")
        array = np.empty(self.shape, self.dtype)
        self._copy(array, non_blocking=False)
        return array if dtype is None else array.astype(dtype, copy=False)

    def _copy(self, target: np.ndarray, non_blocking: bool) -> None:
        destination = torch.from_numpy(target)
        if self._tensor.dtype == torch.bfloat16:
            destination = destination.view(torch.bfloat16)
        destination.copy_(self._tensor, non_blocking=non_blocking)


class TorchBackend:
    is_async = False

    def __init__(self, context: ModelContext) -> None:
        config = context.config
        label = f"{context.model_name}/config.toml"
        options = torch_options(config.parameters, label)  # checked when read
        torch.set_num_threads(context.threads)
        self._device = torch.device(context.device)
        if self._device.type == "cuda" and not torch.cuda.is_available():
            raise BackendError(
                f"{context.model_name}: this torch build cannot use the GPU "
                f"(torch {torch.__version__}, CUDA available: no)"
            )
        # The legacy flags, not the fp32_precision API: in torch 2.14 setting the new one
        # leaves these (still read by inductor's convolution lowering) raising on read.
        torch.backends.cuda.matmul.allow_tf32 = options.allow_tf32
        torch.backends.cudnn.allow_tf32 = options.allow_tf32
        torch.backends.cudnn.benchmark = options.cudnn_benchmark
        self._autocast = _autocast(self._device, config.optimization.precision, context.model_name)
        # A default_model_filename is TorchScript unless it ends as torch.export's files do.
        exported = context.model_file(EXPORT_FILE)
        self._signature: Signature | None = None
        if exported.suffix == ".pt2" and exported.is_file():
            from torch.export.passes import move_to_device_pass

            program = torch.export.load(str(exported))
            self._signature = _rename(_program_signature(program), config.input, config.output)
            module = move_to_device_pass(program, self._device).module()
        else:
            # Declared tensors, no torch_compile: checked when the config was read.
            module = torch.jit.load(str(context.model_file(SCRIPT_FILE)), map_location=self._device)
        self._module = _compiled(module, options.torch_compile, label)
        inputs, outputs = self._signature or (config.input, config.output)
        self._inputs = [(tensor.name, tensor.datatype == "BF16") for tensor in inputs]
        # The config may declare a subset of the file's outputs, as in Triton.
        declared = {tensor.name for tensor in config.output}
        self._outputs = [tensor.name for tensor in outputs]
        self._delivered = [
            (tensor.name, tensor.datatype)
            for tensor in outputs
            if not declared or tensor.name in declared
        ]
        # Pinned mappings by (address, size), each held by a view: a registered range
        # must stay mapped, or a later mapping at that address would inherit a stale pin.
        self._pinned: dict[tuple[int, int], np.ndarray] = {}

    def signature(self) -> Signature | None:
        return self._signature

    def register_host_buffer(self, buffer: mmap.mmap) -> None:
        """Pin a shared-memory mapping (cudaHostRegister) so that copies between it and
        the GPU run asynchronously; once per mapping, and only on a GPU. The mapping is
        held (``close`` on it raises ``BufferError``) until ``unload``."""
        if self._device.type != "cuda":
            return
        view = np.frombuffer(buffer, np.uint8)
        key = (view.ctypes.data, view.nbytes)
        if key in self._pinned:
            return
        try:
            torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(*key, 0))
        except torch.cuda.CudaError as exc:
            raise BackendError(
                f"cannot pin a {view.nbytes}-byte shared-memory slot for {self._device}: {exc}"
            ) from exc
        self._pinned[key] = view

    def release_host_buffer(self, buffer: mmap.mmap) -> None:
        """Unpin a mapping before its slot goes (the pool shrank)."""
        key = (np.frombuffer(buffer, np.uint8).ctypes.data, len(buffer))
        if self._pinned.pop(key, None) is not None:
            torch.cuda.cudart().cudaHostUnregister(key[0])

    def execute(self, inputs: Arrays) -> Outputs:
        with torch.inference_mode():
            arguments = [self._to_device(inputs[name], bf16) for name, bf16 in self._inputs]
            with self._autocast:
                result = self._module(*arguments)
            if isinstance(result, torch.Tensor):
                result = (result,)
            if not isinstance(result, dict):
                result = dict(zip(self._outputs, result, strict=False))
            return {
                name: _deliver(result[name], datatype)
                for name, datatype in self._delivered
                if name in result
            }

    def synchronize(self) -> None:
        """Wait for the batch's queued copies (outputs into pinned slots)."""
        if self._device.type == "cuda":
            torch.cuda.current_stream(self._device).synchronize()

    def unload(self) -> None:
        del self._module
        for address, _ in self._pinned:
            # Status ignored: after a CUDA error that poisoned the context this fails too,
            # and the process is ending; the driver releases the pins with it.
            torch.cuda.cudart().cudaHostUnregister(address)
        self._pinned.clear()

    def _to_device(self, array: np.ndarray, bf16: bool) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if bf16:
            tensor = tensor.view(torch.bfloat16)
        return tensor.to(self._device, non_blocking=True)


def _autocast(device: torch.device, precision: str, model: str) -> AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    try:
        with warnings.catch_warnings():
            # torch warns and runs fp32 for a dtype the device cannot autocast to: refuse.
            warnings.simplefilter("error")
            return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[precision])
    except (RuntimeError, UserWarning) as exc:
        raise BackendError(
            f"{model}: precision {precision} cannot run on {device} under torch.autocast "
            f"({exc}). Hint: choose another [optimization] precision"
        ) from exc


def _compiled(module: Any, setting: bool | CompileOptions, label: str) -> Any:
    if setting is False:
        return module
    options = CompileOptions() if setting is True else setting
    try:
        return torch.compile(
            module,
            mode=options.mode,
            dynamic=None if options.dynamic is UNSET else options.dynamic,
            backend=options.backend,
        )
    except RuntimeError as exc:  # an unknown mode or backend name, in torch's words
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"{label}: parameters.torch_compile: {reason}") from exc


def _deliver(tensor: torch.Tensor, datatype: str) -> TorchOutput | np.ndarray:
    """An output as its declared datatype, converted on the device where that is exact
    enough (a reduced-precision result widened back, bf16 kept as bf16); any other
    mismatch goes to the worker as a host array, under its one rule for output types."""
    want = TORCH_DTYPES.get(datatype)
    if (
        want in _EXPONENT_BITS
        and tensor.dtype in _EXPONENT_BITS
        and _EXPONENT_BITS[tensor.dtype] <= _EXPONENT_BITS[want]
    ):
        tensor = tensor.to(want)
    if tensor.dtype == want:
        return TorchOutput(tensor, NUMPY_DTYPES[datatype])
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()  # exact; numpy has no bfloat16
    return tensor.cpu().numpy()


def _program_signature(program: Any) -> Signature:
    """Tensors of an ExportedProgram from its example values; dynamic dimensions are -1."""
    graph_signature = program.graph_signature
    values = {node.name: node.meta.get("val") for node in program.graph.nodes}
    # The output node returns buffer mutations first, then the user's outputs.
    returned = next(node for node in program.graph.nodes if node.op == "output").args[0]
    user_returned = list(returned)[len(returned) - len(graph_signature.user_outputs) :]
    for name, node in zip(graph_signature.user_outputs, user_returned, strict=True):
        values[name] = node.meta.get("val")

    def describe(name: str) -> TensorConfig:
        value = values.get(name)
        if value is None or value.dtype not in DATATYPES:
            raise BackendError(f"{EXPORT_FILE}: tensor '{name}' has no dtype V2 can carry")
        shape = [dim if isinstance(dim, int) else -1 for dim in value.shape]
        return TensorConfig(name=name, datatype=DATATYPES[value.dtype], shape=shape)

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
