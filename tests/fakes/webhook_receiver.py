"""Both sides of the generic signed webhook, written from its documented format rather than
from our code: a client that POSTs signed requests (`X-Switchboard-Signature: t=<unix>,v1=<hex
HMAC-SHA256 of "<t>.<raw body>">`), and a loopback callback receiver that verifies our
signature the same way, records every delivery and can fail on demand."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import Outage, connection_closer, wait_for_count

SECRET = "fake-webhook-signing-secret"
HEADER = "X-Switchboard-Signature"


def signature(secret: str, ts: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), str(ts).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


async def post_signed(
    url: str,
    payload: Any,
    *,
    secret: str | None = SECRET,
    ts: int | None = None,
    header: str | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    """POST `payload` as JSON (or `raw` bytes) signed with `secret` at `ts` (now by default);
    `header` replaces the signature header as given; secret None sends none."""
    body = raw if raw is not None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers[HEADER] = header
    elif secret is not None:
        headers[HEADER] = signature(secret, int(time.time()) if ts is None else ts, body)
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as resp:
        try:
            return resp.status, await resp.json(content_type=None)
        except ValueError:
            return resp.status, None


@dataclass
class CallbackReceiver:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    secret: str = SECRET
    tolerance_s: float = 300.0
    received: list[dict[str, Any]] = field(default_factory=list)  # verified deliveries
    refused: list[str] = field(default_factory=list)  # why a delivery failed verification
    failures: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    port: int = 0
    keep_alive: bool = True  # False: every answer closes its connection (the next call connects)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def fail_next(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.failures.append((status, headers or {}))

    def replies(self) -> list[dict[str, Any]]:
        return [r for r in self.received if r.get("type") in ("reply", "notice")]

    async def wait_replies(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.replies, n, timeout, "callback replies")

    async def start(self) -> None:
        app = web.Application(
            middlewares=[
                self.outage.middleware(lambda r: r.path == "/hook"),
                connection_closer(self),
            ]
        )
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _verified(self, header: str | None, body: bytes) -> str | None:
        """None if the header signs the body with our secret within the tolerance."""
        if not header:
            return "no signature"
        fields = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
        try:
            ts = int(fields["t"])
        except (KeyError, ValueError):
            return "malformed"
        if abs(time.time() - ts) > self.tolerance_s:
            return "stale"
        if not hmac.compare_digest(
            signature(self.secret, ts, body), f"t={ts},v1={fields.get('v1', '')}"
        ):
            return "bad signature"
        return None

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        why = self._verified(request.headers.get(HEADER), body)
        if why is not None:
            self.refused.append(why)
            return web.json_response({"error": why}, status=401)
        if self.failures:
            status, headers = self.failures.pop(0)
            return web.json_response({"error": "try later"}, status=status, headers=headers)
        self.received.append(json.loads(body))
        return web.json_response({"ok": True})
