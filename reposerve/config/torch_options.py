"""The torch backend's keys in a model's ``[parameters]``, as typed Structs.

```toml
[parameters]
allow_tf32 = false                       # TF32 matmuls and cuDNN convolutions at fp32
cudnn_benchmark = false                  # cuDNN picks kernels per shape
torch_compile = { mode = "max-autotune" } # or true: torch.compile's defaults
```
Checked when the config is read (``reposerve check`` and a load alike). Imports no torch:
whether torch.compile knows a ``mode`` or ``backend`` name, and whether ``torch_compile``
meets a TorchScript file (which it cannot compile), are the backend's to find out at load.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from reposerve.config.tables import convert_table


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
