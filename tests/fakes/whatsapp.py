"""A loopback fake of the WhatsApp Cloud API's Graph endpoints (the phone number lookup and
`/messages`), plus helpers that build webhook deliveries and POST them signed, as Meta
does (`X-Hub-Signature-256`, HMAC-SHA256 of the raw body with the app secret)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import Outage, wait_for_count

PHONE_ID = "109876543210"
TOKEN = "EAAG-fake-token"
APP_SECRET = "fake-app-secret"
VERIFY = "fake-verify-token"
VERSION = "v23.0"


def graph_error(code: int, message: str, status: int = 400) -> tuple[int, dict[str, Any]]:
    return status, {
        "error": {
            "message": message,
            "type": "OAuthException",
            "code": code,
            "fbtrace_id": "AbCdEf",
        }
    }


@dataclass
class FakeGraph:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    token: str = TOKEN
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    failures: list[tuple[int, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    window_closed: set[str] = field(default_factory=set)  # numbers over 24 h since they wrote
    port: int = 0
    keep_alive: bool = True  # False: every answer closes its connection (the next call connects)
    _runner: web.AppRunner | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(
        self, status: int, code: int, message: str = "", headers: dict[str, str] | None = None
    ) -> None:
        """The next send answers `status` with Graph error `code`."""
        self.failures.append((status, graph_error(code, message, status)[1], headers or {}))

    def sent(self) -> list[dict[str, Any]]:
        """Every text message accepted (typing indicators and refused sends left out)."""
        return [
            b
            for m, p, b in self.calls
            if p.endswith("/messages") and b.get("type") == "text" and b.get("_accepted")
        ]

    def typing(self) -> list[dict[str, Any]]:
        return [b for _m, p, b in self.calls if p.endswith("/messages") and "typing_indicator" in b]

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.sent, n, timeout, "WhatsApp sends")

    async def start(self) -> None:
        app = web.Application(
            middlewares=[
                self.outage.middleware(
                    lambda r: r.method == "POST" and r.path.endswith("/messages")
                )
            ]
        )
        app.router.add_get(f"/{{version}}/{PHONE_ID}", self._number)
        app.router.add_post(f"/{{version}}/{PHONE_ID}/messages", self._messages)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        app.on_response_prepare.append(self._closing)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _closing(self, _request: web.Request, response: web.StreamResponse) -> None:
        if not self.keep_alive:
            response.force_close()

    def _authorised(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _number(self, request: web.Request) -> web.Response:
        self.calls.append(("GET", request.path, dict(request.query)))
        if not self._authorised(request):
            status, body = graph_error(
                190, "Invalid OAuth access token - Cannot parse access token", 401
            )
            return web.json_response(body, status=status)
        return web.json_response(
            {
                "verified_name": "Switchboard Test",
                "id": PHONE_ID,
                "display_phone_number": "+1 555-010-0000",
            }
        )

    async def _messages(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("POST", request.path, body))
        if not self._authorised(request):
            status, error = graph_error(190, "Error validating access token", 401)
            return web.json_response(error, status=status)
        if body.get("messaging_product") != "whatsapp":
            return web.json_response(graph_error(100, "Invalid parameter")[1], status=400)
        if body.get("status") == "read":
            return web.json_response({"success": True})
        if self.failures:
            status, error, headers = self.failures.pop(0)
            return web.json_response(error, status=status, headers=headers)
        if body.get("to") in self.window_closed:
            _s, error = graph_error(WINDOW, "(#131047) Re-engagement message")
            return web.json_response(error, status=400)
        if body.get("type") != "text" or not body.get("text", {}).get("body"):
            return web.json_response(graph_error(100, "Invalid parameter")[1], status=400)
        if len(body["text"]["body"]) > 4096:
            return web.json_response(
                graph_error(100, "Param text['body'] is too long")[1], status=400
            )
        body["_accepted"] = True
        wamid = f"wamid.OUT{next(self._ids):04d}"
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                "messages": [{"id": wamid}],
            }
        )

    async def _unknown(self, request: web.Request) -> web.Response:
        print(f"FakeGraph: unimplemented {request.method} {request.path}", flush=True)
        return web.json_response(graph_error(100, "Unknown path")[1], status=400)


WINDOW = 131047


# --- webhook deliveries, as Meta sends them --------------------------------------------


def text_message(
    text: str,
    sender: str = "15551234567",
    wamid: str = "wamid.IN1",
    age_s: float = 0,
    context: str | None = None,
) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "from": sender,
        "id": wamid,
        "timestamp": str(int(time.time() - age_s)),
        "type": "text",
        "text": {"body": text},
    }
    if context:
        msg["context"] = {"from": "15550100000", "id": context}
    return msg


def delivery(
    messages: list[dict[str, Any]] = (),
    statuses: list[dict[str, Any]] = (),  # type: ignore[assignment]
    name: str = "Ann",
) -> dict[str, Any]:
    value: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550100000", "phone_number_id": PHONE_ID},
    }
    if messages:
        value["contacts"] = [{"profile": {"name": name}, "wa_id": m["from"]} for m in messages]
        value["messages"] = list(messages)
    if statuses:
        value["statuses"] = list(statuses)
    return {
        "object": "whatsapp_business_account",
        "entry": [{"id": "WABA1", "changes": [{"value": value, "field": "messages"}]}],
    }


def sign(body: bytes, secret: str = APP_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def deliver(
    url: str,
    payload: dict[str, Any],
    *,
    secret: str | None = APP_SECRET,
    signature: str | None = None,
) -> int:
    """POST a delivery to the daemon like Meta: compact JSON, signed (or not, or forged)."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    elif secret is not None:
        headers["X-Hub-Signature-256"] = sign(body, secret)
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as resp:
        return resp.status
