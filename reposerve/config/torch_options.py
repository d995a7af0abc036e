"""The torch backend's keys in a model's ``[parameters]``, as typed Structs.

```toml
[parameters]
allow_tf32 = false                       # TF32 matmuls and cuDNN convolutions at fp32
cudnn_benchmark = false                  # cuDNN picks kernels per shape
torch_compile = { mode = "max-autotune" } # or true: torch.compile's defaults
```
Checked when the config is read (``reposerve check`` and a load alike), as is what a
TorchScript file (``model.pt``; a ``.pt2`` file is torch.export's, and wins when both are
there) cannot do: be compiled, or tell its tensors. Imports no torch: whether torch.compile
knows a ``mode`` or ``backend`` name is the backend's to find out at load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET, UnsetType

from reposerve.config.tables import convert_table

if TYPE_CHECKING:  # only in annotations: schema imports this module (through backends)
    from reposerve.config.schema import ModelConfig

EXPORT_SUFFIX = ".pt2"  # torch.export's files; any other name is TorchScript


class CompileOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[parameters] torch_compile = { ... }``: torch.compile's own arguments."""

    mode: str = "default"  # "reduce-overhead", "max-autotune", ...
    dynamic: bool | UnsetType = UNSET  # unset: torch recompiles dynamic once shapes vary
    backend: str = "inductor"


class TorchOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The torch backend's keys in ``[parameters]``."""

    allow_tf32: bool = False
    cudnn_benchmark: bool = False
    torch_compile: bool | CompileOptions = False


def torch_options(parameters: dict[str, Any], label: str) -> TorchOptions:
    """This backend's keys of ``[parameters]`` (the others belong to other layers)."""
    raw = {key: parameters[key] for key in TorchOptions.__struct_fields__ if key in parameters}
    table = raw.get("torch_compile")
    if isinstance(table, dict):
        # Converted on its own so that an unknown key there lists the allowed ones too.
        raw["torch_compile"] = convert_table(
            table, CompileOptions, label, "parameters.torch_compile"
        )
    return convert_table(raw, TorchOptions, label, "parameters")


def torch_file_rule(config: ModelConfig, files: tuple[str, ...]) -> str | None:
    """What a config may not ask of a TorchScript version (``files``: the names of
    its model files, at least one), run after ``torch_options`` accepted the parameters."""
    if any(name.endswith(EXPORT_SUFFIX) for name in files):
        return None
    if not (config.input and config.output):
        return (
            "input, output: TorchScript files carry no tensor names or shapes; declare "
            "[[input]] and [[output]] in config.toml (or export with torch.export to "
            f"model{EXPORT_SUFFIX})"
        )
    if config.parameters.get("torch_compile", False) is not False:  # true, or a table
        return (
            f"parameters.torch_compile: torch.compile cannot compile TorchScript ({files[0]}). "
            f"Hint: export the model with torch.export to model{EXPORT_SUFFIX}"
        )
    return None
