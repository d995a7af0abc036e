"""The application builder's arguments: ``serve run reposerve.ray:app KEY=VALUE ...``
gives them as text, a Serve config file's ``args:`` or ``app({...})`` as values.

A few say how Ray runs the replicas (``DeploymentArguments``); every other key is one of
the reposerve command's flags, ``-`` written ``_`` (``model_control_mode=explicit``), read
by the embedded server's parser, so a wrong one fails the build, before any replica
starts, with the words the command would use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from reposerve.embedded.options import settings_for
from reposerve.errors import RayServeError

Positive = Annotated[int, msgspec.Meta(ge=1)]
Share = Annotated[float, msgspec.Meta(ge=0)]


class DeploymentArguments(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How Ray runs the replicas. A fixed ``num_replicas``, or autoscaling on ongoing
    requests between ``min_replicas`` and ``max_replicas`` (``num_replicas=auto`` takes
    Ray's defaults for them), each replica aiming at ``target_ongoing_requests``."""

    model_repository: str
    name: str = "reposerve"  # the deployment's name
    num_replicas: Positive | Literal["auto"] | None = None
    min_replicas: Annotated[int, msgspec.Meta(ge=0)] | None = None
    max_replicas: Positive | None = None
    target_ongoing_requests: Annotated[float, msgspec.Meta(gt=0)] | None = None
    max_ongoing_requests: Positive | None = None  # a replica's cap; Ray queues the rest
    max_replicas_per_node: Positive | None = None
    num_cpus: Share | None = None  # what Ray reserves for a replica (its actor)
    num_gpus: Share | None = None

    def deployment_options(self) -> dict[str, Any]:
        """The options of ``Deployment.options`` these arguments set (the rest Ray's)."""
        options: dict[str, Any] = {"name": self.name}
        autoscaling = {
            key: value
            for key in ("min_replicas", "max_replicas", "target_ongoing_requests")
            if (value := getattr(self, key)) is not None
        }
        if autoscaling:
            if isinstance(self.num_replicas, int):
                raise RayServeError(
                    f"num_replicas={self.num_replicas} fixes the count, and "
                    f"{', '.join(autoscaling)} ask Ray to scale it: give one or the other"
                )
            options["autoscaling_config"] = autoscaling
        for key in ("num_replicas", "max_ongoing_requests", "max_replicas_per_node"):
            if (value := getattr(self, key)) is not None:
                options[key] = value
        actor = {key: value for key in ("num_cpus", "num_gpus") if (value := getattr(self, key))}
        if actor:
            options["ray_actor_options"] = actor
        return options


_FIELDS = frozenset(DeploymentArguments.__struct_fields__)


def read_arguments(args: Mapping[str, Any]) -> tuple[DeploymentArguments, dict[str, Any]]:
    """Ray's arguments and the server's options (checked here, as the replicas will read
    them), or RayServeError naming what is wrong."""
    ours = {key: value for key, value in args.items() if key in _FIELDS}
    options = {key: value for key, value in args.items() if key not in _FIELDS}
    if "model_repository" not in ours:
        raise RayServeError(
            "model_repository: missing; Hint: serve run reposerve.ray:app model_repository=PATH"
        )
    try:
        # Text from the command line is read as the field's type ("2" as 2).
        arguments = msgspec.convert(ours, DeploymentArguments, strict=False)
    except msgspec.ValidationError as exc:
        raise RayServeError(f"reposerve.ray:app: {exc}") from None
    settings_for(arguments.model_repository, options)  # EmbeddedError: an option's fault
    return arguments, options
