"""Triton's ``ModelConfig`` message class, from ``model_config.proto`` beside this module.

The ``.proto`` is the source; ``python -m tools.protos`` compiles it into
``model_config_descriptor`` (its serialized descriptor), which is loaded here into a private
descriptor pool rather than imported as protoc's generated ``_pb2`` code, for two reasons:
generated code registers its messages in protobuf's default pool, where tritonclient
registers Triton's own ``inference.ModelConfig`` (one process importing both fails with a
duplicate symbol), and it refuses a protobuf runtime older than the protoc that made it,
where a serialized descriptor loads on every runtime pyproject.toml allows.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import descriptor_pool, message_factory

from reposerve.config import model_config_descriptor


@functools.cache
def model_config_class() -> Any:
    """The message class of ``inference.ModelConfig`` as declared here."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(model_config_descriptor.FILE)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))
