"""A loopback fake of Twilio's REST API (the account and Messages.json), plus helpers that
POST inbound SMS webhooks signed the way Twilio does: base64 HMAC-SHA1, keyed with the auth
token, of the public URL followed by every form field's name and value in name order."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import Outage, connection_closer, wait_for_count

ACCOUNT = "AC0123456789abcdef0123456789abcdef"
AUTH_TOKEN = "fake-twilio-auth-token"
FROM = "+15550100000"
PUBLIC_URL = "https://switchboard.example.com/sms/webhook"


def twilio_error(status: int, code: int, message: str) -> dict[str, Any]:
    return {
        "code": code,
        "message": message,
        "status": status,
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
    }


@dataclass
class FakeTwilio:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    token: str = AUTH_TOKEN
    calls: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    failures: list[tuple[int, int, str]] = field(default_factory=list)
    keep_alive: bool = True  # False: every answer closes its connection (the next call connects)
    port: int = 0
    _runner: web.AppRunner | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, status: int, code: int, message: str = "") -> None:
        self.failures.append((status, code, message))

    def attempts(self) -> list[dict[str, str]]:
        return [p for m, path, p in self.calls if m == "POST" and path.endswith("/Messages.json")]

    def sent(self) -> list[dict[str, str]]:
        return [p for p in self.attempts() if p.get("_accepted")]

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[dict[str, str]]:
        return await wait_for_count(self.sent, n, timeout, "SMS sends")

    async def start(self) -> None:
        app = web.Application(
            middlewares=[
                self.outage.middleware(
                    lambda r: r.method == "POST" and r.path.endswith("/Messages.json")
                ),
                connection_closer(self),
            ]
        )
        app.router.add_get(f"/2010-04-01/Accounts/{ACCOUNT}.json", self._account)
        app.router.add_post(f"/2010-04-01/Accounts/{ACCOUNT}/Messages.json", self._messages)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _authorised(self, request: web.Request) -> bool:
        expected = base64.b64encode(f"{ACCOUNT}:{self.token}".encode()).decode()
        return request.headers.get("Authorization") == f"Basic {expected}"

    def _refused(self) -> web.Response:
        return web.json_response(twilio_error(401, 20003, "Authenticate"), status=401)

    async def _account(self, request: web.Request) -> web.Response:
        self.calls.append(("GET", request.path, {}))
        if not self._authorised(request):
            return self._refused()
        return web.json_response(
            {
                "sid": ACCOUNT,
                "friendly_name": "Switchboard Test",
                "status": "active",
                "type": "Full",
            }
        )

    async def _messages(self, request: web.Request) -> web.Response:
        params = {k: str(v) for k, v in (await request.post()).items()}
        self.calls.append(("POST", request.path, params))
        if not self._authorised(request):
            return self._refused()
        if self.failures:
            status, code, message = self.failures.pop(0)
            return web.json_response(twilio_error(status, code, message), status=status)
        if not params.get("To") or params.get("From") != FROM:
            return web.json_response(twilio_error(400, 21212, "Invalid From Number"), status=400)
        if not params.get("Body") or len(params["Body"]) > 1600:
            return web.json_response(
                twilio_error(400, 21617, "Body exceeds 1600 characters"), status=400
            )
        params["_accepted"] = "1"
        sid = f"SM{next(self._ids):032x}"
        return web.json_response(
            {
                "sid": sid,
                "account_sid": ACCOUNT,
                "to": params["To"],
                "from": params["From"],
                "body": params["Body"],
                "status": "queued",
                "num_segments": "1",
                "direction": "outbound-api",
                "api_version": "2010-04-01",
            },
            status=201,
        )

    async def _unknown(self, request: web.Request) -> web.Response:
        print(f"FakeTwilio: unimplemented {request.method} {request.path}", flush=True)
        return web.json_response(twilio_error(404, 20404, "Not found"), status=404)


# --- inbound webhooks, as Twilio sends them ---------------------------------------------


def inbound(
    body: str, sid: str = "SM1", sender: str = "+15551234567", media: int = 0
) -> dict[str, str]:
    """The form Twilio POSTs for an incoming SMS (the fields a real one carries)."""
    return {
        "ToCountry": "US",
        "ToState": "CA",
        "SmsMessageSid": sid,
        "NumMedia": str(media),
        "ToCity": "",
        "FromZip": "",
        "SmsSid": sid,
        "FromState": "CA",
        "SmsStatus": "received",
        "FromCity": "",
        "Body": body,
        "FromCountry": "US",
        "To": FROM,
        "ToZip": "",
        "NumSegments": "1",
        "MessageSid": sid,
        "AccountSid": ACCOUNT,
        "From": sender,
        "ApiVersion": "2010-04-01",
    }


def sign(url: str, params: dict[str, str], token: str = AUTH_TOKEN) -> str:
    data = url + "".join(k + params[k] for k in sorted(params))
    return base64.b64encode(hmac.new(token.encode(), data.encode(), hashlib.sha1).digest()).decode()


async def post_sms(
    url: str,
    params: dict[str, str],
    *,
    signed_url: str = PUBLIC_URL,
    token: str | None = AUTH_TOKEN,
    signature: str | None = None,
) -> int:
    """POST `params` to the daemon at `url`, signed over `signed_url` (the public URL Twilio
    was given, which a proxy forwards to `url`)."""
    headers = {}
    if signature is not None:
        headers["X-Twilio-Signature"] = signature
    elif token is not None:
        headers["X-Twilio-Signature"] = sign(signed_url, params, token)
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, data=params, headers=headers) as resp,
    ):
        return resp.status
