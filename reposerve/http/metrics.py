"""``GET /metrics`` on its own port (``--metrics-port``, Triton's 8002; bound to
``--metrics-address``, by default the HTTP address as in Triton).

A separate small listener, as in Triton: scrapes never wait behind inference traffic,
and the inference port stays the one ASGI app. It answers one request per connection.
It owns the CPU/GPU usage sampler, which runs only while metrics are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from reposerve.http.errors import error_body
from reposerve.metrics import CONTENT_TYPE, CustomFamily, MetricsOptions
from reposerve.repository import Repository
from reposerve.repository.exposition import exposition
from reposerve.utilization import UsageSampler

log = logging.getLogger("reposerve.http")

_HEAD_LIMIT = 16 * 1024
_READ_TIMEOUT_S = 10.0


class MetricsServer:
    def __init__(
        self,
        repository: Repository,
        host: str,
        port: int,
        options: MetricsOptions,
        server: Callable[[], Iterable[CustomFamily]] = tuple,
    ) -> None:
        """``server``: the server's own metric families now (its fronts')."""
        self._repository = repository
        self._server_families = server
        self._host = options.address or host
        self._port = port
        self._options = options
        self._server: asyncio.Server | None = None
        self._sampler: UsageSampler | None = None
        if options.cpu or options.gpu:
            self._sampler = UsageSampler(options.interval_ms / 1000, options.cpu, options.gpu)

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._answer, self._host, self._port, limit=_HEAD_LIMIT
        )
        if self._sampler is not None:
            self._sampler.start()
        log.info("metrics on http://%s:%d/metrics", self._host, self._port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._sampler is not None:
            await asyncio.to_thread(self._sampler.stop)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            writer.close()
            return
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if method == b"GET" and path == b"/metrics":
            usage = self._sampler.latest if self._sampler is not None else None
            families = self._server_families()
            body = exposition(self._repository, self._options, usage, families)
            status, media = b"200 OK", CONTENT_TYPE.encode()
        else:
            asked = f"{method.decode(errors='replace')} {path.decode(errors='replace')}"
            status, media = b"404 Not Found", b"application/json"
            body = error_body(f"no such endpoint: {asked}; metrics are at GET /metrics")
        writer.write(
            b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % (status, media, len(body))
            + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
