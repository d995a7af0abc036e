"""``Server``: Triton's in-process server object (``Server(Options(...)).start()``), over
an embedded reposerve server (``reposerve.embedded``): the same repository, instances and
batching as the command. Every call's reposerve error reaches the caller as Triton's
class for it (``errors``); a start that fails is an ``InternalError`` with its reason,
as Triton reports one."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from reposerve.embedded.server import Server as EmbeddedServer
from reposerve.errors import ReposerveError
from reposerve.operations import LoadRequest, ServerMetadataRequest
from reposerve.tritonserver.errors import InternalError, InvalidArgumentError, triton_error
from reposerve.tritonserver.model import Model
from reposerve.tritonserver.options import Options, embedded_arguments, log_level

R = TypeVar("R")
NOT_STARTED = "Server not started"
_FILE = "file:"  # a load parameter naming a model file, as Triton's does


class ModelDictionary(dict[tuple[str, int], Model]):
    """The repository's models by (name, version); by name alone, the model at the
    version its policy serves (KeyError for a name the repository has not)."""

    def __init__(self, server: Server, models: list[Model]) -> None:
        super().__init__(((model.name, model.version), model) for model in models)
        self._server = server
        self._names = {model.name for model in models}

    def __getitem__(self, key: tuple[str, int] | str) -> Model:
        if isinstance(key, tuple) and key in self:
            return dict.__getitem__(self, key)
        if isinstance(key, str) and key in self._names:
            return Model(self._server, key)
        raise KeyError(f"Unknown Model: {key}")


class Server:
    def __init__(self, options: Options | None = None, **fields: Any) -> None:
        """A server with ``options``, or with ``fields`` as ``Options``'s keywords;
        they are checked when it starts."""
        self.options = options if options is not None else Options(**fields)
        self._embedded: EmbeddedServer | None = None
        self._stopped = False
        # Closes the log file: at stop(), or when a server never stopped is dropped
        self._log: weakref.finalize[[], Server] | None = None

    def start(
        self,
        wait_until_ready: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> Server:
        """Start the server and its models' loading; with ``wait_until_ready``, return
        once that loading is over (``polling_interval`` is taken for Triton's signature:
        the loading's end is awaited, not polled)."""
        if self._embedded is not None:
            raise InvalidArgumentError("Server already started")
        repositories, keywords = embedded_arguments(self.options)
        level = log_level(self.options)
        if self.options.log_file is not None and level is not None:
            # the records go there while the server runs (without it, this process's
            # logging decides where they go)
            self._log = weakref.finalize(self, _LogFile(self.options.log_file, level).close)
        try:
            embedded = EmbeddedServer(repositories, **keywords)
            embedded.start(wait_until_ready=wait_until_ready, timeout=timeout)
        except ReposerveError as error:
            self._close_log()
            raise InternalError(f"the server failed to start: {error.message}") from None
        self._embedded = embedded
        return self

    def stop(self) -> None:
        """Stop the server: its models unload (requests under way may finish within
        ``exit_timeout``). Again is harmless."""
        self._stopped = True
        if self._embedded is not None:
            self._embedded.stop()
        self._close_log()

    def embedded(self) -> EmbeddedServer:
        """The embedded server under this one; InvalidArgumentError before the start."""
        if self._embedded is None:
            raise InvalidArgumentError(NOT_STARTED)
        return self._embedded

    # -- the server -----------------------------------------------------------------------

    def live(self) -> bool:
        self.embedded()
        return not self._stopped

    def ready(self) -> bool:
        return self._asking(lambda server: server.ready())

    def metadata(self) -> dict[str, Any]:
        metadata = self._asking(lambda server: server.perform(ServerMetadataRequest()))
        return msgspec.to_builtins(metadata)

    # -- its models -----------------------------------------------------------------------

    def model(self, model_name: str, model_version: int = -1) -> Model:
        return Model(self, model_name, model_version)

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        entries = self._asking(lambda server: server.models(ready=exclude_not_ready))
        models = [
            Model(
                self,
                entry.name,
                int(entry.version) if entry.version else -1,
                entry.state or None,
                entry.reason or None,
            )
            for entry in entries
        ]
        return ModelDictionary(self, models)

    def load(self, model_name: str, parameters: dict[str, Any] | None = None) -> Model:
        """Load (or reload) a model and wait for it to be ready; ``parameters``, as
        Triton's: ``"config"`` (its model-config JSON, in place of the folder's) and
        ``"file:<path>"`` (that file's bytes). Needs ModelControlMode.EXPLICIT."""
        config, files = _load_parameters(parameters or {})
        self._asking(lambda server: server.perform(LoadRequest(model_name, config, files)))
        return self.model(model_name)

    def unload(
        self,
        model: str | Model,
        unload_dependents: bool = False,
        wait_until_unloaded: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> None:
        """Unload a model (its every version). The call returns once it is unloaded,
        so ``wait_until_unloaded`` and its polling have nothing left to wait for."""
        name = model if isinstance(model, str) else model.name
        self._asking(lambda server: server.unload(name, unload_dependents))

    def _close_log(self) -> None:
        if self._log is not None:
            self._log()

    def _asking(self, ask: Callable[[EmbeddedServer], R]) -> R:
        """``ask`` of the embedded server, its errors as Triton's."""
        server = self.embedded()
        try:
            return ask(server)
        except ReposerveError as error:
            raise triton_error(error) from None


class _LogFile:
    """The 'reposerve' logger's records written to a file at a level, until closed."""

    def __init__(self, path: str, level: int) -> None:
        self.handler = logging.FileHandler(path)
        self.handler.setLevel(level)
        logger = logging.getLogger("reposerve")
        self.level_before = logger.level
        logger.addHandler(self.handler)
        if logger.getEffectiveLevel() > level:
            logger.setLevel(level)

    def close(self) -> None:
        logger = logging.getLogger("reposerve")
        logger.removeHandler(self.handler)
        logger.setLevel(self.level_before)
        self.handler.close()


def _load_parameters(parameters: dict[str, Any]) -> tuple[str | None, dict[str, bytes]]:
    """A load's configuration and files, from Triton's load parameters."""
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if key == "config" and isinstance(value, str | bytes):
            config = value.decode() if isinstance(value, bytes) else value
        elif key.startswith(_FILE) and isinstance(value, bytes):
            files[key.removeprefix(_FILE)] = value
        else:
            raise InvalidArgumentError(
                f"load parameter '{key}' ({type(value).__name__}): expected 'config' (the "
                "model-config JSON) or 'file:<path>' (the file's bytes)"
            )
    return config, files
