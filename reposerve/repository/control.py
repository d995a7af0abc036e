"""Triton's model control API: loading a model (with a request's own config and files) and
unloading it on request, under ``--model-control-mode`` and ``--allow-model-file-override``.

A front's request comes as an operation (``LoadRequest``, ``UnloadRequest``) whose case in
``InferenceService.perform`` calls ``RepositoryControl``. A model's own request (Triton's
``pb_utils.load_model`` and friends) comes from its instance as a ``ModelControl`` frame:
``model_request`` decodes its body as the HTTP endpoint's and runs it through that same
``perform``, so a model meets the rules a client does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol, TypeVar

import msgspec

from reposerve.config.onnx_options import file_options
from reposerve.config.triton_json import parse_triton_config
from reposerve.errors import ErrorKind, ProtocolError, ReposerveError, RepositoryError
from reposerve.instance.messages import CallFailure, CallResult, ModelControl
from reposerve.operations import LoadRequest, ModelReadyRequest, Operation, UnloadRequest
from reposerve.protocol.repository import decode_load_request, decode_unload_request
from reposerve.repository.manager import Repository
from reposerve.repository.scan import ConfigOverride, check_model_name
from reposerve.repository.version import ModelState

R = TypeVar("R")


class Perform(Protocol):
    """``InferenceService.perform``: run an operation for its result."""

    def __call__(self, operation: Operation[R], /) -> Awaitable[R]: ...


class RepositoryControl:
    """Loads and unloads on request. ``mode``: --model-control-mode (only ``explicit`` and
    ``on-demand`` take requests); ``allow_file_override``: whether a load may bring its
    own model files (code the instances will run)."""

    def __init__(self, repository: Repository, mode: str, allow_file_override: bool) -> None:
        self.repository = repository
        self.mode = mode
        self.allow_file_override = allow_file_override

    async def load(self, request: LoadRequest) -> None:
        """Triton's load, with its overrides: ``config`` (Triton's JSON config, used instead
        of the folder's) and ``files`` (the model folder's, only with
        --allow-model-file-override)."""
        self._check_mode()
        name = request.name
        check_model_name(name)  # before its config can name it otherwise
        if request.files and not self.allow_file_override:
            raise ProtocolError(
                f"load '{name}': file: parameters would write model code onto this server, "
                "which it refuses. Hint: start it with --allow-model-file-override true to "
                "accept them",
                kind=ErrorKind.FORBIDDEN,
            )
        override = None
        if request.config is not None:
            override = await self._config_override(name, request.config)
        if not request.files:  # else the request brings the model's files
            await self._pull(name)
        attempted = await self.repository.load(name, override, request.files)
        failed = [v for v in attempted if v.state is not ModelState.READY]
        if failed:
            kept = {
                v.version for v in self.repository.versions(name) if v.state is ModelState.READY
            }
            reasons = "; ".join(
                f"version {v.version}: {v.reason}"
                + (" (the previous one keeps serving)" if v.version in kept else "")
                for v in failed
            )
            raise RepositoryError(
                f"failed to load '{name}': {reasons}", kind=ErrorKind.INVALID_ARGUMENT
            )

    async def unload(self, request: UnloadRequest) -> None:
        """Triton's unload; with ``unload_dependents`` the ensembles that call the model go
        too (otherwise they stop serving, saying why)."""
        self._check_mode()
        await self.repository.unload(request.name, dependents=request.unload_dependents)

    async def _config_override(self, name: str, document: str) -> ConfigOverride:
        """A load's ``parameters.config``, checked as the folder's config would be."""
        label = f"failed to load '{name}': parameters.config"  # Triton's words first
        # Off the loop too: a config of many MB takes its time to check.
        config = await asyncio.to_thread(parse_triton_config, document, label, name)
        paths = file_options(config.parameters)
        if paths and not self.allow_file_override:  # they make the server write there
            raise ProtocolError(
                f"{label}: {', '.join(paths)} would make this server write where a load "
                "request says, which it refuses. Hint: start it with "
                "--allow-model-file-override true to accept them",
                kind=ErrorKind.FORBIDDEN,
            )
        return ConfigOverride(config, label)

    async def _pull(self, name: str) -> None:
        """A model in a remote repository loads as it is in the bucket now, as in Triton:
        a bucket that cannot be read fails the load (a version serving keeps serving)."""
        try:
            await self.repository.mirrors.pull(name)
        except RepositoryError as exc:
            raise RepositoryError(
                f"failed to load '{name}': {exc.message}", kind=exc.kind
            ) from None

    def _check_mode(self) -> None:
        if self.mode not in ("explicit", "on-demand"):
            raise RepositoryError(
                "explicit model load / unload is not allowed with "
                f"--model-control-mode {self.mode}",
                kind=ErrorKind.INVALID_ARGUMENT,
            )


async def model_request(control: ModelControl, perform: Perform) -> CallResult | CallFailure:
    """A model's own request to load, unload or ask after a model (Triton's
    ``pb_utils.load_model`` and friends), run by ``perform``: the control API's, with its
    rules. Its body is the HTTP control endpoint's; it answers whether the model is ready."""
    try:
        if control.action == "load":
            # Off the loop: a load may carry whole model files, base64 in JSON.
            load = await asyncio.to_thread(decode_load_request, control.model, control.body)
            await perform(load)
        elif control.action == "unload":
            await perform(decode_unload_request(control.model, control.body))
    except ReposerveError as exc:
        return CallFailure(control.call_id, exc.message, exc.kind)
    ready = await perform(ModelReadyRequest(control.model, control.version or None))
    return CallResult(control.call_id, 0, [], msgspec.json.encode({"ready": ready}).decode())
