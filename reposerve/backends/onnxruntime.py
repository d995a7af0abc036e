"""The onnxruntime backend: ``N/model.onnx``.

CPU instances use the CPU provider only (asking onnxruntime-gpu for CUDA on a machine
without a driver logs an error before falling back). GPU instances use CUDA, or TensorRT
first when ``[parameters]`` asks (see ``onnx_options``), with the provider options the
config gives (checked when the config was read, ``reposerve.config.onnx_options``, as is
``precision``: fp32 or fp16 here); if a provider cannot start, the load fails saying what
is missing.
``precision = "fp16"`` converts the graph with the converter onnxruntime ships, keeping
fp32 inputs and outputs, once per model version content: the first instance to start
writes it to the cache (``file_cache``), the others load that file.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from reposerve.backends.base import Arrays, BackendError, ModelContext, Signature
from reposerve.backends.file_cache import build_once, cache_root, content_digest, exclusive
from reposerve.backends.onnx_options import (
    CPU_PROVIDER,
    Provider,
    engine_cache_path,
    gpu_providers,
)
from reposerve.config import TensorConfig
from reposerve.config.onnx_options import OnnxParameters, onnx_parameters
from reposerve.config.schema import Datatype
from reposerve.errors import InvalidInput

log = logging.getLogger("reposerve.backends")

MODEL_FILE = "model.onnx"
# The name spells the converter's settings: other settings would make another file.
FP16_FILE = "model.fp16-keep-io-types.onnx"

# onnxruntime's type strings -> V2 datatypes
DATATYPES: dict[str, Datatype] = {
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
STRING = "tensor(string)"
GPU_NEEDS = "onnxruntime-gpu with CUDA 13 and cuDNN 9 on the machine"


class OnnxRuntimeBackend:
    is_async = False

    def __init__(self, context: ModelContext) -> None:
        # Checked when the config was read (reposerve.config.parameters), precision too.
        label = f"{context.model_name}/config.toml"
        parameters = onnx_parameters(context.config.parameters, label)
        path = context.model_file(MODEL_FILE)
        precision = context.config.optimization.precision
        options = ort.SessionOptions()
        options.intra_op_num_threads = context.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: warnings about unused initialisers are noise
        model: str | bytes = str(path)
        providers = [CPU_PROVIDER]
        if precision == "fp16" or context.device != "cpu":
            derived = _derived_folder(context, path)
            if precision == "fp16":
                model = _fp16_model(path, derived / FP16_FILE)
            if context.device != "cpu":
                # Its few CPU threads wait on the GPU: spinning would burn cores the front needs.
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                providers = self._providers(context, parameters, derived)
        with ExitStack() as stack:
            engines = engine_cache_path(providers)
            if engines is not None:
                # TensorRT builds engines while the session is made and onnxruntime writes
                # them in place: one instance builds (minutes), the others then load them.
                try:
                    stack.enter_context(exclusive(engines / "build.lock"))
                except OSError as exc:
                    log.warning(
                        "%s: cannot lock %s (%s); instances may each build engines",
                        context.model_name,
                        engines,
                        exc,
                    )
            try:
                self._session = ort.InferenceSession(model, options, providers=providers)
            except Exception as exc:  # onnxruntime raises its own untyped errors
                raise BackendError(f"{path}: onnxruntime cannot load it: {exc}") from exc
        wanted = providers[0][0]
        if wanted != "CPUExecutionProvider" and wanted not in self._session.get_providers():
            raise BackendError(
                f"{context.model_name}: {wanted} could not start on this GPU instance; "
                f"it needs {GPU_NEEDS}"
            )
        # Only what the config declares is computed: it may name a subset, as in Triton.
        declared = [tensor.name for tensor in context.config.output]
        self._outputs = declared or [output.name for output in self._session.get_outputs()]
        # tensor(string): onnxruntime takes and gives numpy arrays of str, V2 carries bytes.
        self._string_inputs = {
            node.name for node in self._session.get_inputs() if node.type == STRING
        }
        self._string_outputs = {
            node.name for node in self._session.get_outputs() if node.type == STRING
        }

    @staticmethod
    def _providers(
        context: ModelContext, parameters: OnnxParameters, derived: Path
    ) -> list[Provider]:
        providers = gpu_providers(
            parameters,
            context.config.optimization.precision,
            gpu=int(context.device.partition(":")[2] or 0),
            engine_cache=derived / f"tensorrt-ort{ort.__version__}",
        )
        available = ort.get_available_providers()
        missing = [name for name, _ in providers if name not in available]
        if missing:
            raise BackendError(
                f"{context.model_name}: {', '.join(missing)} not in this onnxruntime build "
                f"(available: {', '.join(available)}); install {GPU_NEEDS}"
            )
        return providers

    def signature(self) -> Signature:
        return (
            [_tensor(item) for item in self._session.get_inputs()],
            [_tensor(item) for item in self._session.get_outputs()],
        )

    def execute(self, inputs: Arrays) -> Arrays:
        for name in self._string_inputs & inputs.keys():
            inputs[name] = _strings(inputs[name], name)
        results = dict(zip(self._outputs, self._session.run(self._outputs, inputs), strict=True))
        for name in self._string_outputs & results.keys():
            results[name] = _encoded(results[name])
        return results

    def unload(self) -> None:
        del self._session


def _strings(values: np.ndarray, name: str) -> np.ndarray:
    """A BYTES input (bytes objects) as onnxruntime's tensor(string) takes it: str."""
    try:
        return np.vectorize(lambda item: item.decode("utf-8"), otypes=[object])(values)
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"input '{name}': the model takes strings and this element is not UTF-8 ({exc})"
        ) from exc


def _encoded(values: np.ndarray) -> np.ndarray:
    """A tensor(string) output (str objects) as BYTES carries it: UTF-8 bytes."""
    return np.vectorize(
        lambda item: item.encode("utf-8") if isinstance(item, str) else item, otypes=[object]
    )(values)


def _tensor(node: Any) -> TensorConfig:
    """An onnxruntime NodeArg as a TensorConfig; symbolic dimensions become -1."""
    datatype = DATATYPES.get(node.type)
    if datatype is None:
        raise BackendError(f"tensor '{node.name}' has type {node.type}, which V2 cannot carry")
    shape = [dim if isinstance(dim, int) and dim >= 0 else -1 for dim in node.shape]
    return TensorConfig(name=node.name, datatype=datatype, shape=shape)


def _derived_folder(context: ModelContext, path: Path) -> Path:
    """Where files made from this version's model go. Keyed by the file's bytes: a new
    model.onnx under an old version number never meets the graph or engines of the old."""
    try:
        digest = content_digest(path)[:16]
    except OSError as exc:
        raise BackendError(f"{path}: cannot read it: {exc.strerror}") from exc
    return cache_root() / "onnxruntime" / context.model_name / str(context.version) / digest


def _fp16_model(source: Path, target: Path) -> str | bytes:
    """The fp16 graph's path in the cache, converted by the first instance to get there;
    its bytes, converted here, when the cache cannot be written."""
    try:
        build_once(target, lambda: _to_fp16(source))
    except OSError as exc:
        log.warning(
            "%s: cannot keep the fp16 graph in %s (%s); converting it in this instance",
            source,
            target.parent,
            exc,
        )
        return _to_fp16(source)
    return str(target)


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
