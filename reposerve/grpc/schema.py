"""Triton's ``inference.GRPCInferenceService`` and gRPC's ``grpc.health.v1.Health``: their
message classes and calls, from ``grpc_service.proto`` and ``health.proto`` beside this
module (with ``ModelConfig``, which the config response embeds, from
``reposerve/config/model_config.proto``).

The ``.proto`` files are the source; ``python -m tools.protos`` compiles them into the
``*_descriptor`` modules, loaded here into a private descriptor pool as
``reposerve.config.triton_schema`` loads ``ModelConfig`` (its docstring says why not
protoc's generated stubs).
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import descriptor, descriptor_pool, message_factory

from reposerve.config import model_config_descriptor
from reposerve.grpc import grpc_service_descriptor, health_descriptor

PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"
HEALTH_PACKAGE = "grpc.health.v1"
HEALTH_SERVICE = f"{HEALTH_PACKAGE}.Health"

# The protocol each call belongs to, as --grpc-restricted-protocol names it (Triton's
# names, as for HTTP).
CATEGORIES = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    **{
        f"{kind}SharedMemory{verb}": "shared-memory"
        for kind in ("System", "Cuda")
        for verb in ("Status", "Register", "Unregister")
    },
}


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    built = descriptor_pool.DescriptorPool()
    for compiled in (model_config_descriptor, grpc_service_descriptor, health_descriptor):
        built.AddSerializedFile(compiled.FILE)
    return built


@functools.cache
def message_class(full_name: str) -> Any:
    """The message class of ``full_name`` (e.g. ``inference.ModelInferRequest``)."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))


def _method(method: descriptor.MethodDescriptor) -> tuple[str, str, str, str]:
    return method.name, method.input_type.name, method.output_type.name, CATEGORIES[method.name]


_CALLS = pool().FindServiceByName(SERVICE).methods
# (method, request message, response message, category) of each unary call, in the
# service's order; and of the one streaming call, whose requests and responses both flow
# as streams.
METHODS = tuple(_method(call) for call in _CALLS if not call.client_streaming)
(STREAM_METHOD,) = (_method(call) for call in _CALLS if call.client_streaming)
