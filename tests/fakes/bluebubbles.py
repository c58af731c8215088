"""A loopback fake of a BlueBubbles Server's REST API (the subset a gateway uses: server info,
sending text, the Private API's typing calls), checking the `password` query parameter the way
the server does, plus helpers that POST webhooks the way BlueBubbles does (JSON
`{"type": "new-message", "data": <message>}`, no signature) and build those messages."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import Outage, connection_closer, wait_for_count

PASSWORD = "fake-bluebubbles-password"
SECRET = "fake-webhook-secret"
ACCOUNT = "bot@icloud.example"
ANN = "+15551234567"
DM = f"iMessage;-;{ANN}"
GROUP = "iMessage;+;chat493817261"


def error(status: int, kind: str, message: str, detail: str) -> web.Response:
    return web.json_response(
        {"status": status, "message": message, "error": {"type": kind, "message": detail}},
        status=status,
    )


@dataclass
class FakeBlueBubbles:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    password: str = PASSWORD
    private_api: bool = False
    send_delay_s: float = 0.0  # how long a send takes (Messages.app can be slow)
    keep_alive: bool = True  # False: every answer closes its connection (the next call connects)
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    failures: list[tuple[int, str, dict[str, str]]] = field(default_factory=list)
    port: int = 0
    _queued: set[str] = field(default_factory=set)  # the server's send cache of tempGuids
    _delivered: list[dict[str, Any]] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(
        self, status: int, detail: str = "", headers: dict[str, str] | None = None
    ) -> None:
        self.failures.append((status, detail, headers or {}))

    def attempts(self) -> list[dict[str, Any]]:
        return [b for m, p, b in self.calls if m == "POST" and p == "/api/v1/message/text"]

    def sent(self) -> list[dict[str, Any]]:
        """Every text Messages.app actually sent, in order."""
        return list(self._delivered)

    def typing(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _b in self.calls if p.endswith("/typing")]

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.sent, n, timeout, "iMessage sends")

    async def start(self) -> None:
        app = web.Application(
            middlewares=[
                self.outage.middleware(lambda r: r.path == "/api/v1/message/text"),
                connection_closer(self),
            ]
        )
        app.router.add_get("/api/v1/server/info", self._info)
        app.router.add_post("/api/v1/message/text", self._send_text)
        app.router.add_route("*", "/api/v1/chat/{guid}/typing", self._typing)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _refused(self, request: web.Request) -> web.Response | None:
        """The server's auth middleware: `guid`, `password` or `token` in the query."""
        q = request.query
        token = q.get("guid") or q.get("password") or q.get("token")
        if not token:
            return error(
                401,
                "Authentication Error",
                "You are not authorized to access this resource",
                "Missing server password!",
            )
        if token.strip() != self.password:
            return error(
                401,
                "Authentication Error",
                "You are not authorized to access this resource",
                "You are not authorized to access this resource",
            )
        return None

    async def _info(self, request: web.Request) -> web.Response:
        self.calls.append(("GET", request.path, {}))
        if (refused := self._refused(request)) is not None:
            return refused
        return web.json_response(
            {
                "status": 200,
                "message": "Successfully fetched information!",
                "data": {
                    "computer_id": "fake-mac",
                    "os_version": "15.1",
                    "server_version": "1.9.9",
                    "private_api": self.private_api,
                    "helper_connected": self.private_api,
                    "detected_icloud": ACCOUNT,
                    "detected_imessage": ACCOUNT,
                },
            }
        )

    async def _send_text(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("POST", request.path, body))
        if (refused := self._refused(request)) is not None:
            return refused
        if self.failures:
            status, detail, headers = self.failures.pop(0)
            kind = "Server Error" if status >= 500 else "Validation Error"
            resp = error(status, kind, "failed", detail or f"HTTP {status}")
            resp.headers.update(headers)
            return resp
        temp, method = body.get("tempGuid"), body.get("method") or "apple-script"
        if not isinstance(body.get("chatGuid"), str) or method not in (
            "apple-script",
            "private-api",
        ):
            return error(400, "Validation Error", "bad request", "chatGuid is required")
        if method == "apple-script" and not temp:
            return error(
                400,
                "Validation Error",
                "bad request",
                "A 'tempGuid' is required when sending via AppleScript",
            )
        if method == "private-api" and not self.private_api:
            return error(500, "iMessage Error", "Message Send Error", "Private API is not enabled")
        if not body.get("message"):
            return error(400, "Validation Error", "bad request", "A 'message' is required")
        if temp in self._queued:
            return error(
                400,
                "Validation Error",
                "bad request",
                f"Message is already queued to be sent! (Temp GUID: {temp})",
            )
        self._queued.add(temp)
        try:
            await asyncio.sleep(self.send_delay_s)
            guid = f"FAKE-{next(self._ids):08d}"
            self._delivered.append({**body, "guid": guid})
        finally:
            self._queued.discard(temp)
        return web.json_response(
            {
                "status": 200,
                "message": "Message sent!",
                "data": {
                    "guid": guid,
                    "text": body["message"],
                    "tempGuid": temp,
                    "isFromMe": True,
                    "dateCreated": int(time.time() * 1000),
                    "error": 0,
                    "chats": [{"guid": body["chatGuid"]}],
                },
            }
        )

    async def _typing(self, request: web.Request) -> web.Response:
        self.calls.append((request.method, request.path, {}))
        if (refused := self._refused(request)) is not None:
            return refused
        if not self.private_api:
            return error(500, "Server Error", "failed", "Private API is not enabled")
        return web.json_response({"status": 200, "message": "Success", "data": None})

    async def _unknown(self, request: web.Request) -> web.Response:
        print(f"FakeBlueBubbles: unimplemented {request.method} {request.path}", flush=True)
        return error(404, "Database Error", "not found", "The requested resource was not found")


# --- webhooks, as BlueBubbles sends them ------------------------------------------------


def new_message(
    text: str | None,
    *,
    guid: str = "MSG-1",
    sender: str = ANN,
    chat: str = DM,
    from_me: bool = False,
    age_s: float = 0.0,
    chat_name: str = "",
    attachments: int = 0,
    tapback: str | None = None,
) -> dict[str, Any]:
    """A `new-message` webhook with the fields a real one carries (the serialized message)."""
    return {
        "type": "new-message",
        "data": {
            "originalROWID": 4211,
            "guid": guid,
            "text": text,
            "attributedBody": None,
            "handle": {
                "originalROWID": 12,
                "address": sender,
                "service": "iMessage",
                "country": "us",
                "uncanonicalizedId": None,
            },
            "handleId": 12,
            "otherHandle": 0,
            "chats": [
                {
                    "originalROWID": 7,
                    "guid": chat,
                    "style": 43 if ";+;" in chat else 45,
                    "chatIdentifier": chat.rpartition(";")[2],
                    "isArchived": False,
                    "displayName": chat_name,
                }
            ],
            "attachments": [
                {"guid": f"ATT-{i}", "mimeType": "image/jpeg", "transferName": "a.jpg"}
                for i in range(attachments)
            ],
            "subject": None,
            "error": 0,
            "dateCreated": int((time.time() - age_s) * 1000),
            "dateRead": None,
            "dateDelivered": None,
            "isFromMe": from_me,
            "isDelayed": False,
            "isAutoReply": False,
            "isSystemMessage": False,
            "isServiceMessage": False,
            "isForward": False,
            "isArchived": False,
            "cacheRoomnames": None,
            "isAudioMessage": False,
            "datePlayed": None,
            "itemType": 0,
            "groupTitle": None,
            "groupActionType": 0,
            "isExpired": False,
            "balloonBundleId": None,
            "associatedMessageGuid": f"p:0/{guid}" if tapback else None,
            "associatedMessageType": tapback,
            "expressiveSendStyleId": None,
            "threadOriginatorGuid": None,
            "hasPayloadData": False,
        },
    }


async def post_webhook(url: str, payload: dict[str, Any], secret: str | None = SECRET) -> int:
    """POST a webhook as BlueBubbles does; the secret rides in the URL we gave it."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            url, json=payload, params={"secret": secret} if secret is not None else None
        ) as resp,
    ):
        return resp.status
