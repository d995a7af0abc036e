"""``Model``: one model of a started server, by name and version (-1: the version its
policy serves), as Triton's ``server.model(name)`` gives it: inference, metadata,
readiness, configuration and statistics. The model is not looked up until it is used."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Unpack

import msgspec

from reposerve.errors import ReposerveError
from reposerve.tritonserver.enums import ModelBatchFlag, ModelTxnPropertyFlag
from reposerve.tritonserver.errors import triton_error
from reposerve.tritonserver.request import InferenceRequest, RequestFields
from reposerve.tritonserver.response import (
    AsyncResponseIterator,
    InferenceResponse,
    ResponseIterator,
    Responses,
    queued_for,
    queued_on,
)

if TYPE_CHECKING:
    from reposerve.tritonserver.server import Server


class Model:
    def __init__(
        self,
        server: Server,
        name: str,
        version: int = -1,
        state: str | None = None,
        reason: str | None = None,
    ) -> None:
        self._server = server.embedded()  # InvalidArgumentError before the start
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    def create_request(self, **fields: Unpack[RequestFields]) -> InferenceRequest:
        return InferenceRequest(model=self, **fields)

    def infer(
        self,
        inference_request: InferenceRequest | None = None,
        raise_on_error: bool = True,
        **fields: Unpack[RequestFields],
    ) -> ResponseIterator:
        """Send a request (``inference_request``, or one of ``fields``) and return an
        iterator of its responses. A request the server refuses outright (an unknown
        model, a bad input) raises here."""
        request = inference_request or self.create_request(**fields)
        own: queue.SimpleQueue[InferenceResponse] = queue.SimpleQueue()
        sent = self._send(request, queued_for(own, request.response_queue))
        return ResponseIterator(own, sent, raise_on_error)

    def async_infer(
        self,
        inference_request: InferenceRequest | None = None,
        raise_on_error: bool = True,
        **fields: Unpack[RequestFields],
    ) -> AsyncResponseIterator:
        """``infer`` for an ``async for`` on the running event loop (the request's refusal
        is checked in the call, as Triton's is)."""
        request = inference_request or self.create_request(**fields)
        own: asyncio.Queue[InferenceResponse] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        sent = self._send(request, queued_on(loop, own, request.response_queue))
        return AsyncResponseIterator(own, sent, raise_on_error)

    def _send(
        self, request: InferenceRequest, put: Callable[[InferenceResponse], None]
    ) -> concurrent.futures.Future[None]:
        """Send ``request``; each of its responses goes to ``put``."""
        inputs, options = request.call()
        responses = Responses(self, put)
        try:
            return self._server.open_stream(self.name, inputs, responses.deliver, **options)
        except ReposerveError as error:
            raise triton_error(error) from None

    def metadata(self) -> dict[str, Any]:
        return msgspec.to_builtins(self._asking(self._server.metadata))

    def ready(self) -> bool:
        return self._asking(self._server.ready)

    def config(self, config_version: int = 1) -> dict[str, Any]:
        """The configuration, in Triton's model-config JSON (its only version, 1)."""
        return self._asking(self._server.config)

    def statistics(self) -> dict[str, Any]:
        return msgspec.to_builtins(self._asking(self._server.statistics))

    def batch_properties(self) -> ModelBatchFlag:
        batching = self.config().get("max_batch_size", 0) > 0
        return ModelBatchFlag.FIRST_DIM if batching else ModelBatchFlag.UNKNOWN

    def transaction_properties(self) -> ModelTxnPropertyFlag:
        policy = self.config().get("model_transaction_policy", {})
        decoupled = policy.get("decoupled", False)
        return ModelTxnPropertyFlag.DECOUPLED if decoupled else ModelTxnPropertyFlag.ONE_TO_ONE

    def _asking(self, ask: Any) -> Any:
        """``ask(name, version)`` of the embedded server, its errors as Triton's."""
        try:
            return ask(self.name, None if self.version == -1 else self.version)
        except ReposerveError as error:
            raise triton_error(error) from None

    def __repr__(self) -> str:
        return str({"name": self.name, "version": self.version, "state": self.state})
