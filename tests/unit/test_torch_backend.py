"""The torch backend in this process: autocast precision, BF16 at the boundary, TF32 and
cuDNN flags, torch.compile, .pt2 device moves, outputs handed over as TorchOutput, and
pinned staging (on a GPU only)."""

from __future__ import annotations

import mmap
import warnings
from pathlib import Path

import numpy as np
import pytest

from reposerve.backends.base import ModelContext
from reposerve.config import parse_model_config
from reposerve.errors import ReposerveError

torch = pytest.importorskip("torch", reason="the torch extra is not installed")
model_files = pytest.importorskip("tests.model_files", reason="the torch extra is not installed")
from reposerve.backends.torch import TorchBackend, TorchOutput  # noqa: E402 - needs torch

pytestmark = pytest.mark.unit

TOLERANCE = model_files.TOLERANCE
VALUES = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
SCRIPT_CONFIG = """
max_batch_size = 8
[[input]]
name = "INPUT"
datatype = "FP32"
shape = [4]
[[output]]
name = "OUTPUT"
datatype = "{output}"
shape = [{size}]
"""


def _load(path: Path, config: str = "max_batch_size = 8", device: str = "cpu") -> TorchBackend:
    """A backend on the model file in ``path``'s folder."""
    return TorchBackend(
        ModelContext(
            model_name="m",
            config=parse_model_config(config, "m/config.toml"),
            version=1,
            version_path=path.parent,
            device=device,
            instance_index=0,
            threads=1,
        )
    )


def _precision(name: str, parameters: str = "") -> str:
    return f'max_batch_size = 8\n[optimization]\nprecision = "{name}"\n[parameters]\n{parameters}'


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "model.pt2"
    model_files.export_program(path)
    return path


@pytest.fixture(scope="module")
def bf16_program(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bf16") / "model.pt2"
    model_files.export_bf16_program(path)
    return path


@pytest.fixture
def math_flags():
    """The process-wide flags a backend sets, restored after the test."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved[0]
    torch.backends.cudnn.allow_tf32 = saved[1]
    torch.backends.cudnn.benchmark = saved[2]


def _only(outputs: dict) -> TorchOutput:
    """The one output of a one-output model (a .pt2 file names it after its last op)."""
    (output,) = outputs.values()
    return output


def _host(output: TorchOutput) -> np.ndarray:
    target = np.empty(output.shape, output.dtype)
    output.copy_into(target)
    return target


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_runs_under_autocast_and_delivers_the_declared_type(
    program, precision, math_flags
):
    output = _only(_load(program, _precision(precision)).execute({"x": VALUES}))
    assert isinstance(output, TorchOutput)
    assert output.dtype == np.float32 and output.shape == (5, 3)
    result = _host(output)
    reference = model_files.reference(VALUES)
    assert not np.allclose(result, reference, rtol=0, atol=1e-6)  # it did run lower
    np.testing.assert_allclose(
        result, reference, atol=TOLERANCE[precision], rtol=TOLERANCE[precision]
    )


class Shift(torch.nn.Module):
    """BatchNorm whose statistics bf16 cannot hold: mean 1000.25 rounds to 1000 in bf16."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(4)
        self.norm.running_mean.fill_(1000.25)

    def forward(self, x):
        return self.norm(x)


def test_autocast_keeps_normalisation_statistics_in_fp32(tmp_path, math_flags):
    path = tmp_path / "model.pt2"
    batch = torch.export.Dim("batch", min=1, max=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(
            Shift().eval(), (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}}
        )
    torch.export.save(exported, str(path))
    values = np.full((2, 4), 1000.5, np.float32)
    output = _only(_load(path, _precision("bf16")).execute({"x": values}))
    # Casting the module to bf16 would give (1000 - 1000) = 0 here.
    np.testing.assert_allclose(_host(output), 0.25, rtol=1e-3)


def test_bf16_tensors_cross_the_boundary_as_bit_patterns(bf16_program, math_flags):
    backend = _load(bf16_program)
    inputs, outputs = backend.signature()
    assert [t.datatype for t in inputs + outputs] == ["BF16", "BF16"]
    bits = (VALUES.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16, truncated
    output = _only(backend.execute({"x": bits}))
    assert output.dtype == np.uint16  # BF16's wire type
    np.testing.assert_array_equal(_host(output), model_files.reference_bf16(bits))
    np.testing.assert_array_equal(np.asarray(output), model_files.reference_bf16(bits))


def test_a_torch_output_reaches_numpy_only_as_a_copy(program, math_flags):
    output = _only(_load(program).execute({"x": VALUES}))
    np.testing.assert_allclose(np.asarray(output), model_files.reference(VALUES), atol=1e-5)
    assert np.asarray(output, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="only as a copy"):
        output.__array__(copy=False)


class Doubles(torch.nn.Module):
    """INPUT: FP32 [batch, 4] -> its values doubled, as int64."""

    def forward(self, x):
        return (x * 2).to(torch.int64)


def _script_doubles(folder: Path) -> Path:
    path = folder / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice is not ours
        torch.jit.script(Doubles()).save(str(path))
    return path


# The backend loads TorchScript, which torch now deprecates: that notice is for the user.
LOADS_TORCHSCRIPT = pytest.mark.filterwarnings("ignore:`torch.jit.load`:FutureWarning")


@LOADS_TORCHSCRIPT
@pytest.mark.parametrize(
    ("declared", "kind"), [("INT64", TorchOutput), ("INT32", np.ndarray), ("FP32", np.ndarray)]
)
def test_outputs_of_another_type_go_to_the_worker_rule_as_host_arrays(
    tmp_path, declared, kind, math_flags
):
    path = _script_doubles(tmp_path)
    output = _load(path, SCRIPT_CONFIG.format(output=declared, size=4)).execute(
        {"INPUT": np.ones((2, 4), np.float32)}
    )["OUTPUT"]
    assert isinstance(output, kind)
    np.testing.assert_array_equal(np.asarray(output), np.full((2, 4), 2, np.int64))


def test_fp32_math_is_ieee_unless_tf32_is_allowed(program, math_flags):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    _load(program)
    assert not torch.backends.cuda.matmul.allow_tf32
    assert not torch.backends.cudnn.allow_tf32
    _load(program, _precision("fp32", "allow_tf32 = true"))
    assert torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"


def test_cudnn_benchmark_is_set_as_asked(program, math_flags):
    _load(program, _precision("fp32", "cudnn_benchmark = true"))
    assert torch.backends.cudnn.benchmark
    _load(program)
    assert not torch.backends.cudnn.benchmark


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ('allow_tf32 = "yes"', "m/config.toml: parameters.allow_tf32: expected bool, got str"),
        (
            "cudnn_benchmark = 1",
            "m/config.toml: parameters.cudnn_benchmark: expected bool, got int",
        ),
        (
            'torch_compile = "max-autotune"',
            "m/config.toml: parameters.torch_compile: expected bool | object, got str",
        ),
        (
            "torch_compile = { fullgraph = true }",
            "m/config.toml: parameters.torch_compile.fullgraph: unknown key "
            "(allowed: mode, dynamic, backend)",
        ),
        (
            "torch_compile = { dynamic = 1 }",
            "m/config.toml: parameters.torch_compile.dynamic: expected bool, got int",
        ),
        (
            'torch_compile = { mode = "fastest" }',
            "m/config.toml: parameters.torch_compile: Unrecognized mode=fastest, should be one "
            "of: default, lite, reduce-overhead, max-autotune-no-cudagraphs, max-autotune",
        ),
    ],
)
def test_wrong_options_fail_the_load_naming_the_key(program, parameters, message, math_flags):
    with pytest.raises(ReposerveError) as caught:
        _load(program, _precision("fp32", parameters))
    assert caught.value.message == message


def test_torch_compile_wraps_the_module(program, math_flags):
    from torch._dynamo import register_backend

    graphs = []

    @register_backend(name="reposerve_test_recorder")
    def recorder(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    parameters = 'torch_compile = { backend = "reposerve_test_recorder", dynamic = true }'
    backend = _load(program, _precision("fp32", parameters))
    assert graphs == []  # compiled on the first batch, not at load
    output = _only(backend.execute({"x": VALUES}))
    np.testing.assert_allclose(_host(output), model_files.reference(VALUES), atol=1e-5)
    assert len(graphs) == 1


def test_a_program_is_moved_by_the_export_pass(program, monkeypatch, math_flags):
    import torch.export.passes

    moves = []
    original = torch.export.passes.move_to_device_pass

    def spy(exported, location):
        moves.append(location)
        return original(exported, location)

    monkeypatch.setattr(torch.export.passes, "move_to_device_pass", spy)
    _load(program)
    assert moves == [torch.device("cpu")]


def test_a_precision_autocast_refuses_is_a_load_error(program, monkeypatch, math_flags):
    def refuse(device_type, dtype):
        raise RuntimeError("Current CUDA Device does not support bfloat16.")

    monkeypatch.setattr(torch, "autocast", refuse)
    with pytest.raises(ReposerveError) as caught:
        _load(program, _precision("bf16"))
    assert caught.value.message == (
        "m: precision bf16 cannot run on cpu under torch.autocast (Current CUDA Device does "
        "not support bfloat16.). Hint: choose another [optimization] precision"
    )


def test_on_cpu_host_buffers_are_left_alone(program, math_flags):
    backend = _load(program)
    buffer = mmap.mmap(-1, 4096)
    backend.register_host_buffer(buffer)
    backend.synchronize()
    buffer.close()  # a pinned mapping would be held (BufferError) until unload
    backend.unload()


@pytest.mark.gpu
def test_on_a_gpu_slots_are_pinned_and_outputs_copied_into_them(program, math_flags):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    backend = _load(program, _precision("bf16"), device="cuda:0")
    buffer = mmap.mmap(-1, 1 << 16)
    backend.register_host_buffer(buffer)
    backend.register_host_buffer(buffer)  # once per mapping
    slot = np.frombuffer(buffer, np.uint8)
    assert torch.from_numpy(slot).is_pinned()
    inputs = slot[: VALUES.nbytes].view(np.float32).reshape(VALUES.shape)
    inputs[...] = VALUES
    output = _only(backend.execute({"x": inputs}))
    assert output.dtype == np.float32
    target = slot[4096 : 4096 + 5 * 3 * 4].view(np.float32).reshape(5, 3)
    output.copy_into(target)
    backend.synchronize()
    np.testing.assert_allclose(target, model_files.reference(VALUES), atol=TOLERANCE["bf16"])
    del inputs, target, slot
    with pytest.raises(BufferError):
        buffer.close()  # held by the backend while pinned
    backend.unload()
    buffer.close()
