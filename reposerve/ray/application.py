"""``app``, the application builder ``serve run reposerve.ray:app model_repository=PATH``
calls: its arguments read (``arguments``), the replica deployment (``replica``) bound."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.serve import Application

from reposerve.ray.arguments import read_arguments
from reposerve.ray.replica import Reposerve


def app(args: Mapping[str, Any]) -> Application:
    """A Serve application serving the model repository ``args["model_repository"]``;
    the other arguments: see ``DeploymentArguments`` and the reposerve command's flags."""
    arguments, options = read_arguments(args)
    deployment = Reposerve.options(**arguments.deployment_options())
    return deployment.bind(arguments.model_repository, options)
