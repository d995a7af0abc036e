"""Reading a model folder by its file names: which backend each version runs, what a
folder without a config file becomes, and the rules a backend sets on the config given its
model files (a TorchScript file), all from the backend table."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reposerve.errors import ConfigError
from reposerve.repository.scan import read_model
from tests.toy_models import vector_config

pytestmark = pytest.mark.unit

DECLARED = textwrap.dedent(vector_config(size=4))  # INPUT and OUTPUT, FP32 [4]


def _folder(root: Path, files: list[str], config: str | None = None) -> Path:
    version = root / "m" / "1"
    version.mkdir(parents=True)
    for name in files:
        (version / name).write_bytes(b"not read: scan looks at names only")
    if config is not None:
        (root / "m" / "config.toml").write_text(config)
    return root


def _error(root: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        read_model(root, "m")
    return caught.value.message


@pytest.mark.parametrize(
    ("files", "backend"),
    [
        (["model.onnx"], "onnxruntime"),
        (["model.py"], "python"),
        (["model.py", "model.onnx"], "onnxruntime"),
    ],
)
def test_a_folder_without_config_is_what_its_file_says(tmp_path, files, backend):
    source = read_model(_folder(tmp_path, files), "m")
    assert [version.backend for version in source.versions] == [backend]
    assert source.config.default_max_batch_size == (4 if backend == "onnxruntime" else 0)


def test_a_folder_without_config_or_a_file_that_needs_none_is_refused(tmp_path):
    assert _error(_folder(tmp_path, ["model.pt"])) == (
        "m/config.toml: missing. Hint: every model folder needs one (or Triton's config.pbtxt); "
        "only an ONNX model (N/model.onnx) or a python model whose auto_complete_config fills "
        "it in (N/model.py) may go without"
    )


STEP = '[[step]]\nmodel = "a"\ninput_map = { INPUT = "INPUT" }\noutput_map = { OUTPUT = "OUTPUT" }'


def test_an_ensemble_needs_no_model_file_and_is_a_pipeline(tmp_path):
    config = f'backend = "ensemble"\n{DECLARED}{STEP}\n'
    source = read_model(_folder(tmp_path, [], config), "m")
    assert [(version.backend, version.pipeline) for version in source.versions] == [
        ("ensemble", True)
    ]


def test_a_model_file_names_the_backend(tmp_path):
    source = read_model(_folder(tmp_path, ["model.pt2"], "max_batch_size = 2"), "m")
    assert [(version.backend, version.pipeline) for version in source.versions] == [
        ("torch", False)
    ]


def test_torchscript_declares_its_tensors(tmp_path):
    assert _error(_folder(tmp_path, ["model.pt"], "max_batch_size = 2")) == (
        "m/config.toml: input, output: TorchScript files carry no tensor names or shapes; "
        "declare [[input]] and [[output]] in config.toml (or export with torch.export to "
        "model.pt2)"
    )


@pytest.mark.parametrize("setting", ["true", '{ mode = "max-autotune" }'])
def test_torchscript_cannot_be_compiled(tmp_path, setting):
    config = f"{DECLARED}[parameters]\ntorch_compile = {setting}\n"
    assert _error(_folder(tmp_path, ["model.pt"], config)) == (
        "m/config.toml: parameters.torch_compile: torch.compile cannot compile TorchScript "
        "(model.pt). Hint: export the model with torch.export to model.pt2"
    )


def test_a_program_beside_torchscript_is_the_one_loaded_so_it_may_be_compiled(tmp_path):
    config = "max_batch_size = 2\n[parameters]\ntorch_compile = true\n"
    source = read_model(_folder(tmp_path, ["model.pt", "model.pt2"], config), "m")
    assert [version.backend for version in source.versions] == ["torch"]
