"""The onnxruntime backend: ``N/model.onnx``.

CPU instances use the CPU provider only (asking onnxruntime-gpu for CUDA on a machine
without a driver logs an error before falling back). GPU instances use CUDA, or TensorRT
first when ``[parameters] tensorrt = true``; if the provider cannot start, the load fails
saying what is missing. ``precision = "fp16"`` converts the graph at load, keeping fp32
inputs and outputs, with the converter onnxruntime ships.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reposerve.backends.base import Arrays, BackendError, ModelContext, Signature
from reposerve.config import TensorConfig

MODEL_FILE = "model.onnx"

# onnxruntime's type strings -> V2 datatypes
DATATYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}
GPU_NEEDS = "onnxruntime-gpu with CUDA 13 and cuDNN 9 on the machine"


class OnnxRuntimeBackend:
    is_async = False

    def __init__(self, context: ModelContext) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BackendError(
                "the onnxruntime backend needs the onnx extra: pip install 'reposerve[onnx]'"
            ) from exc
        path = context.version_path / MODEL_FILE
        options = ort.SessionOptions()
        options.intra_op_num_threads = context.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: warnings about unused initialisers are noise
        if context.device != "cpu":
            # Its few CPU threads wait on the GPU: spinning would only burn cores the front needs.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = self._providers(ort, context)
        model: str | bytes = str(path)
        precision = context.config.optimization.precision
        if precision == "fp16":
            model = _to_fp16(path)
        elif precision == "bf16":
            raise BackendError(
                f"{context.model_name}: precision bf16 is not supported by the onnxruntime "
                f"backend (providers: {', '.join(providers)}); use fp16 or fp32"
            )
        try:
            self._session = ort.InferenceSession(model, options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise BackendError(f"{path}: onnxruntime cannot load it: {exc}") from exc
        wanted = providers[0]
        if wanted != "CPUExecutionProvider" and wanted not in self._session.get_providers():
            raise BackendError(
                f"{context.model_name}: {wanted} could not start on this GPU instance; "
                f"it needs {GPU_NEEDS}"
            )
        # Only what the config declares is computed: it may name a subset, as in Triton.
        declared = [tensor.name for tensor in context.config.output]
        self._outputs = declared or [output.name for output in self._session.get_outputs()]

    @staticmethod
    def _providers(ort: Any, context: ModelContext) -> list[str]:
        if context.device == "cpu":
            return ["CPUExecutionProvider"]
        available = ort.get_available_providers()
        wanted = ["CUDAExecutionProvider"]
        if context.config.parameters.get("tensorrt") is True:
            wanted.insert(0, "TensorrtExecutionProvider")
        missing = [provider for provider in wanted if provider not in available]
        if missing:
            raise BackendError(
                f"{context.model_name}: {', '.join(missing)} not in this onnxruntime build "
                f"(available: {', '.join(available)}); install {GPU_NEEDS}"
            )
        return [*wanted, "CPUExecutionProvider"]

    def signature(self) -> Signature:
        return (
            [_tensor(item) for item in self._session.get_inputs()],
            [_tensor(item) for item in self._session.get_outputs()],
        )

    def execute(self, inputs: Arrays) -> Arrays:
        results = self._session.run(self._outputs, inputs)
        return dict(zip(self._outputs, results, strict=True))

    def unload(self) -> None:
        del self._session


def _tensor(node: Any) -> TensorConfig:
    """An onnxruntime NodeArg as a TensorConfig; symbolic dimensions become -1."""
    datatype = DATATYPES.get(node.type)
    if datatype is None:
        raise BackendError(f"tensor '{node.name}' has type {node.type}, which V2 cannot carry")
    shape = [dim if isinstance(dim, int) and dim >= 0 else -1 for dim in node.shape]
    return TensorConfig(name=node.name, datatype=datatype, shape=shape)


def _to_fp16(path: Path) -> bytes:
    try:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise BackendError(
            "precision fp16 for onnx models needs the onnx package: pip install 'reposerve[onnx]'"
        ) from exc
    model = onnx.load(str(path))
    converted = convert_float_to_float16(model, keep_io_types=True)
    return converted.SerializeToString()
