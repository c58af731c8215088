"""A loopback round-robin HTTP load balancer (aiohttp) in front of the replicas.

It does what a plain reverse proxy does for webhooks and the HTTP API: each request goes
to the next backend in turn; a backend that refuses the connection (dead, restarting) is
skipped, since nothing was sent to it; anything that fails after the request went out (the
replica died mid-request) is a 502, and the sender decides whether to deliver again. No
stickiness: any replica may receive any chat's message.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

import aiohttp
from aiohttp import web

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


class Balancer:
    """Round-robin over `backends()` (called per request, so restarts and pauses show at
    once). `sent` counts requests per backend, `failed` the 502s it answered."""

    def __init__(self, backends: Callable[[], list[str]], timeout_s: float = 30.0) -> None:
        self._backends = backends
        self._turn = itertools.count()
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=2.0)
        self._http: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.sent: Counter[str] = Counter()
        self.failed = 0
        self.errors: Counter[str] = Counter()  # why requests failed, by exception name

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        # no pooled connections: a kept-alive socket to a killed replica would turn the
        # next request into a failure after sending instead of a clean refusal
        self._http = aiohttp.ClientSession(
            timeout=self._timeout,
            connector=aiohttp.TCPConnector(force_close=True, limit=0),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        backends = self._backends()
        for _ in range(max(1, len(backends))):
            if not backends:
                break
            target = backends[next(self._turn) % len(backends)]
            try:
                async with self._http.request(
                    request.method,
                    target + request.rel_url.path_qs,
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                ) as resp:
                    payload = await resp.read()
                    self.sent[target] += 1
                    out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
                    return web.Response(status=resp.status, body=payload, headers=out)
            except aiohttp.ClientConnectorError as exc:
                self.errors[f"refused ({type(exc).__name__})"] += 1
                continue  # refused: nothing reached that backend, so the next one may try
            except (TimeoutError, aiohttp.ClientError) as exc:
                self.errors[type(exc).__name__] += 1
                break  # it may have acted on it: only the sender may decide to send again
            backends = self._backends()
        self.failed += 1
        if not backends:
            self.errors["no backend"] += 1
        return web.Response(status=502, text="bad gateway")
