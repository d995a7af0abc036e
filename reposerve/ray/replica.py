"""A Ray Serve replica: one reposerve server inside Ray's replica actor.

Ray's HTTP proxy hands each request to the replica's ASGI app, which is reposerve's own
HTTP front (``reposerve.http``: the same routes, V2 JSON and binary tensors, errors and
status codes); Python callers reach ``infer`` through a ``DeploymentHandle`` with numpy
arrays, as the embedded server takes them. Both run on the replica's one event loop, the
loop the server lives on, so no call crosses threads.

1. ``__init__``: the server's settings, read as the embedded server reads its options.
2. The app's lifespan (Ray runs it before the replica takes traffic): the server opens
   and its models load; a model that fails to load fails the start (with
   ``exit_on_error``, the default), so Ray retries the replica and reports why.
3. Teardown (Ray calls ``__del__`` when it scales down or redeploys): the lifespan's end,
   the server's one shutdown: requests under way may finish within ``exit_timeout_secs``.
"""

from __future__ import annotations

from typing import Any, Unpack

from ray import serve
from ray.serve import Deployment

from reposerve.embedded.options import settings_for
from reposerve.embedded.tensors import CallOptions, InferResult, Inputs, infer_arrays, request_parts
from reposerve.errors import RayServeError
from reposerve.http.app import App
from reposerve.http.server import build
from reposerve.server import Server


class ReplicaServer(Server):
    """The server a replica holds: open once its models have loaded."""

    async def open(self) -> None:
        await super().open()
        if (failure := await self.start_failure()) is not None:
            raise RayServeError(failure)


class Replica:
    """A replica: reposerve's HTTP front through Ray's proxy, ``infer`` for handles."""

    def __init__(self, model_repository: str, options: dict[str, Any]) -> None:
        self._settings = settings_for(model_repository, options)
        self._server = ReplicaServer(self._settings, embedded=True)

    def __serve_build_asgi_app__(self) -> App:
        return build(self._server, self._settings)  # its lifespan opens and closes the server

    async def infer(
        self, model: str, inputs: Inputs, **options: Unpack[CallOptions]
    ) -> InferResult:
        """One request's response, as ``reposerve.Server.infer`` gives it: ``inputs`` by
        name as numpy arrays, outputs as arrays; ``options``: version, outputs,
        parameters, request_id."""
        header, raws = request_parts(inputs, options)
        return await infer_arrays(self._server.service, model, options, header, raws)


# Ray's ingress around the class, with no app given: each replica builds its own, around
# its own server (``__serve_build_asgi_app__``).
Reposerve: Deployment = serve.deployment(name="reposerve")(serve.ingress()(Replica))
