"""A front process: HTTP (on the listening socket it inherited) and/or gRPC (on the same
port, SO_REUSEPORT), serving every call through the server's process
(``reposerve.fronts.remote``).

The server decides when it leaves: its ``Leave`` frame (or its end) stops this front
accepting; what was accepted is answered, then the process exits. SIGINT is the
server's to act on (a terminal sends it to the whole group); SIGTERM sent to this
process alone makes it leave the same way (the server replaces it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
import uvloop

from reposerve.allocator import return_large_blocks
from reposerve.fronts.remote import RemoteService
from reposerve.fronts.workers import SPEC_VARIABLE, FrontSpec, decode_spec
from reposerve.http.server import SEND_MARGIN_S, serve_http
from reposerve.logs import start_logging

if TYPE_CHECKING:
    from reposerve.grpc.server import GrpcFront


class FrontHost:
    """The ``Host`` a front's HTTP server attaches to (``reposerve.http.server``)."""

    def __init__(self, spec: FrontSpec) -> None:
        self.spec = spec
        self.service = RemoteService(f"reposerve-front-{spec.index}", self._leave)
        self.stop_serving: Callable[[], None] = lambda: None
        self.signals = (signal.SIGTERM,)  # SIGINT is the server's (see above)
        self._left = asyncio.Event()
        self._grpc: GrpcFront | None = None
        self._closing: asyncio.Task | None = None

    def _leave(self) -> None:
        self._left.set()
        self.stop_serving()

    async def open(self) -> None:
        link = socket.socket(fileno=self.spec.link_fd)
        await asyncio.get_running_loop().connect_accepted_socket(lambda: self.service, link)
        if self.spec.grpc:
            from reposerve.grpc.server import GrpcFront  # grpcio loads only when served

            front = GrpcFront(self.service, self.spec.settings)
            await front.start()
            self._grpc = front

    async def close(self) -> None:
        await self.begin_shutdown()
        self.service.close()

    async def grace(self) -> None:
        """The server's to keep: this front leaves at once."""

    def skip_grace(self) -> None:
        pass

    def begin_shutdown(self) -> asyncio.Task:
        """This front's gRPC stops taking calls (its HTTP server stops on its own); the
        calls it took finish within the budget."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._stop_grpc())
        return self._closing

    async def _stop_grpc(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(self.spec.settings.exit_timeout_secs + SEND_MARGIN_S)

    async def leave(self, signalled: asyncio.Event) -> None:
        """Until a SIGTERM or the server's word."""
        waits = [asyncio.ensure_future(signalled.wait()), asyncio.ensure_future(self._left.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def run(self) -> None:
        """Serve gRPC alone: the loop is this front's until it leaves."""
        signalled = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, signalled.set)
        try:
            await self.open()
            await self.leave(signalled)
        finally:
            await self.close()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return_large_blocks()
    spec = decode_spec(os.environ.pop(SPEC_VARIABLE))
    settings = spec.settings
    # Its output goes where the server's does already (inherited): no file of its own.
    start_logging(msgspec.structs.replace(settings, log_file=""))
    host = FrontHost(spec)
    if spec.http_fd is None:
        uvloop.run(host.run())
    else:
        with contextlib.suppress(KeyboardInterrupt):
            serve_http(host, settings, socket.socket(fileno=spec.http_fd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
