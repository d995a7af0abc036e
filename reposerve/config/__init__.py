"""config.toml (and Triton's config.pbtxt): the schema as msgspec Structs, and loading
with file/key/reason errors."""

from reposerve.config.complete import complete_config
from reposerve.config.load import find_config, load_model_config, parse_model_config
from reposerve.config.schema import (
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    Optimization,
    SequenceBatching,
    TensorConfig,
    VersionPolicy,
    Warmup,
)
from reposerve.config.tables import convert_table

__all__ = [
    "DynamicBatching",
    "InstanceGroup",
    "ModelConfig",
    "Optimization",
    "SequenceBatching",
    "TensorConfig",
    "VersionPolicy",
    "complete_config",
    "convert_table",
    "find_config",
    "Warmup",
    "load_model_config",
    "parse_model_config",
]
