"""``GET /metrics`` on its own port (``--metrics-port``, Triton's 8002).

A separate small listener, as in Triton: scrapes never wait behind inference traffic,
and the inference port stays the one ASGI app. It answers one request per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from reposerve.http.errors import error_body
from reposerve.metrics import CONTENT_TYPE
from reposerve.service import InferenceService

log = logging.getLogger("reposerve.http")

_HEAD_LIMIT = 16 * 1024
_READ_TIMEOUT_S = 10.0


class MetricsServer:
    def __init__(self, service: InferenceService, host: str, port: int) -> None:
        self._service = service
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._answer, self._host, self._port, limit=_HEAD_LIMIT
        )
        log.info("metrics on http://%s:%d/metrics", self._host, self._port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            writer.close()
            return
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if method == b"GET" and path == b"/metrics":
            status, media, body = b"200 OK", CONTENT_TYPE.encode(), self._service.metrics()
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
