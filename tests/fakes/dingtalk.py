"""A loopback fake of DingTalk for dingtalk-stream: the token and connection-open endpoints,
the stream websocket speaking the library's frames (CALLBACK pushes, SYSTEM ping and
disconnect, ack frames back), the session webhook and the robot API's two send calls."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import Outage, wait_for_count

CLIENT_ID = "dingfakeclientid"
CLIENT_SECRET = "fake-client-secret"
BOT_ID = "$:LWCP_v1:$bot"
TOPIC = "/v1.0/im/bot/messages/get"
ENV = {"DINGTALK_CLIENT_ID": CLIENT_ID, "DINGTALK_CLIENT_SECRET": CLIENT_SECRET}


SEND_PATHS = (
    "/robot/sendBySession",
    "/v1.0/robot/groupMessages/send",
    "/v1.0/robot/oToMessages/batchSend",
)


@dataclass
class FakeDingTalk:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    client_secret: str = CLIENT_SECRET
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    failures: dict[str, list[tuple[int, dict[str, Any], dict[str, str]]]] = field(
        default_factory=dict
    )
    acks: dict[str, dict[str, Any]] = field(default_factory=dict)
    subscriptions: list[list[dict[str, str]]] = field(default_factory=list)
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    keep_alive: bool = True  # False: each HTTP answer closes its connection (next call connects)
    port: int = 0
    _tickets: set[str] = field(default_factory=set)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def webhook(self, session: str = "s1") -> str:
        return f"{self.base_url}/robot/sendBySession?session={session}"

    def fail_next(
        self,
        kind: str,
        status: int,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The next `kind` call ("webhook", "group", "dm") answers `status` with `body`."""
        self.failures.setdefault(kind, []).append((status, body or {}, headers or {}))

    def sent(self) -> list[tuple[str, dict[str, Any]]]:
        """(kind, {"chat", "title", "text"}) for every message accepted, in order."""
        return [(k, p) for k, p in self.calls if k in ("webhook", "group", "dm") and p.get("ok")]

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[tuple[str, dict[str, Any]]]:
        return await wait_for_count(self.sent, n, timeout, "DingTalk messages")

    async def wait_connected(self, count: int = 1, timeout: float = 10.0) -> web.WebSocketResponse:
        def opened() -> list[web.WebSocketResponse]:
            ready = len(self.sockets) >= count and not self.sockets[-1].closed
            return self.sockets if ready else []

        await wait_for_count(opened, 1, timeout, f"{count} stream connections")
        return self.sockets[-1]

    async def wait_ack(self, message_id: str, timeout: float = 10.0) -> dict[str, Any]:
        await wait_for_count(
            lambda: [1] if message_id in self.acks else [], 1, timeout, f"ack {message_id}"
        )
        return self.acks[message_id]

    async def start(self) -> None:
        app = web.Application(
            middlewares=[self.outage.middleware(lambda r: r.path in SEND_PATHS), self._closing]
        )
        app.router.add_post("/v1.0/oauth2/accessToken", self._token)
        app.router.add_post("/v1.0/gateway/connections/open", self._open)
        app.router.add_get("/connect", self._connect)
        app.router.add_post("/robot/sendBySession", self._webhook)
        app.router.add_post("/v1.0/robot/groupMessages/send", self._group)
        app.router.add_post("/v1.0/robot/oToMessages/batchSend", self._dm)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        for ws in self.sockets:
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _closing(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        if not self.keep_alive and not isinstance(response, web.WebSocketResponse):
            response.force_close()
        return response

    # --- the stream --------------------------------------------------------------------

    async def push(self, data: dict[str, Any], frame_id: str | None = None) -> str:
        """A robot message as a CALLBACK frame on the newest connection; returns the frame's
        messageId (what the ack names)."""
        frame_id = frame_id or f"frame-{next(self._ids)}"
        await self._frame("CALLBACK", TOPIC, frame_id, data)
        return frame_id

    async def system(self, topic: str, data: dict[str, Any] | None = None) -> str:
        frame_id = f"sys-{next(self._ids)}"
        await self._frame("SYSTEM", topic, frame_id, data or {})
        return frame_id

    async def _frame(self, kind: str, topic: str, frame_id: str, data: dict[str, Any]) -> None:
        ws = await self.wait_connected(1)
        headers = {
            "appId": "app-1",
            "connectionId": f"conn-{len(self.sockets)}",
            "contentType": "application/json",
            "messageId": frame_id,
            "time": str(int(time.time() * 1000)),
            "topic": topic,
        }
        await ws.send_str(
            json.dumps(
                {"specVersion": "1.0", "type": kind, "headers": headers, "data": json.dumps(data)}
            )
        )

    async def _connect(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("ticket") not in self._tickets:
            return web.Response(status=401)
        self._tickets.discard(request.query["ticket"])  # a ticket opens one connection
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.sockets.append(ws)
        async for msg in ws:
            try:
                ack = json.loads(msg.data)
                self.acks[ack["headers"]["messageId"]] = ack
            except (TypeError, ValueError, KeyError):
                print(f"FakeDingTalk: unreadable frame from the client: {msg.data!r}", flush=True)
        return ws

    # --- HTTP --------------------------------------------------------------------------

    async def _unknown(self, request: web.Request) -> web.Response:
        print(f"FakeDingTalk: unimplemented {request.method} {request.path}", flush=True)
        return web.json_response({"code": "NotFound", "message": "unknown"}, status=404)

    async def _token(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("token", body))
        if (body.get("appKey"), body.get("appSecret")) != (CLIENT_ID, self.client_secret):
            return web.json_response(
                {"code": "invalidClientSecret", "message": "bad secret", "requestid": "r1"},
                status=400,
            )
        token = f"at-{len(self.tokens) + 1}"
        self.tokens.append(token)
        return web.json_response({"accessToken": token, "expireIn": 7200})

    async def _open(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("open", body))
        if (body.get("clientId"), body.get("clientSecret")) != (CLIENT_ID, self.client_secret):
            return web.json_response(
                {"code": "invalidClientSecret", "message": "bad secret"}, status=401
            )
        self.subscriptions.append(body.get("subscriptions") or [])
        ticket = f"ticket-{next(self._ids)}"
        self._tickets.add(ticket)
        return web.json_response(
            {"endpoint": f"ws://127.0.0.1:{self.port}/connect", "ticket": ticket}
        )

    def _failure(self, kind: str) -> web.Response | None:
        queued = self.failures.get(kind)
        if queued:
            status, body, headers = queued.pop(0)
            return web.json_response(body, status=status, headers=headers)
        return None

    async def _webhook(self, request: web.Request) -> web.Response:
        body = await request.json()
        record = {
            "chat": request.query.get("session"),
            "msgtype": body.get("msgtype"),
            "title": body["markdown"]["title"],
            "text": body["markdown"]["text"],
        }
        self.calls.append(("webhook", record))
        refused = self._failure("webhook")
        if refused is not None:
            return refused
        record["ok"] = True
        return web.json_response({"errcode": 0, "errmsg": "ok"})

    async def _robot(self, request: web.Request, kind: str, chat: str) -> web.Response:
        body = await request.json()
        param = json.loads(body["msgParam"])
        record = {
            "chat": chat,
            "robotCode": body.get("robotCode"),
            "msgKey": body.get("msgKey"),
            "title": param["title"],
            "text": param["text"],
        }
        self.calls.append((kind, record))
        if request.headers.get("x-acs-dingtalk-access-token") not in self.tokens:
            return web.json_response(
                {"code": "InvalidAuthentication", "message": "token"}, status=401
            )
        refused = self._failure(kind)
        if refused is not None:
            return refused
        record["ok"] = True
        answer: dict[str, Any] = {"processQueryKey": f"pqk-{next(self._ids)}"}
        if kind == "dm":
            answer.update(invalidStaffIdList=[], flowControlledStaffIdList=[])
        return web.json_response(answer)

    async def _group(self, request: web.Request) -> web.Response:
        body = await request.json()
        return await self._robot(request, "group", str(body.get("openConversationId")))

    async def _dm(self, request: web.Request) -> web.Response:
        body = await request.json()
        return await self._robot(request, "dm", ",".join(body.get("userIds") or []))


def robot_message(
    text: str,
    *,
    fake: FakeDingTalk,
    conversation_type: str = "1",
    conversation_id: str = "cidDM1",
    staff_id: str | None = "alice01",
    msg_id: str = "msg1",
    at_bot: bool = False,
    session: str = "s1",
    expires_in_s: int = 3600,
    title: str = "Team",
) -> dict[str, Any]:
    """A robot message as DingTalk puts it in a CALLBACK frame's data."""
    now_ms = int(time.time() * 1000)
    data: dict[str, Any] = {
        "conversationId": conversation_id,
        "chatbotCorpId": "corp1",
        "chatbotUserId": BOT_ID,
        "msgId": msg_id,
        "senderNick": "Alice",
        "isAdmin": False,
        "senderId": "$:LWCP_v1:$alice",
        "sessionWebhookExpiredTime": now_ms + expires_in_s * 1000,
        "createAt": now_ms,
        "senderCorpId": "corp1",
        "conversationType": conversation_type,
        "isInAtList": at_bot,
        "sessionWebhook": fake.webhook(session),
        "robotCode": CLIENT_ID,
        "msgtype": "text",
        "text": {"content": text},
        "atUsers": [{"dingtalkId": BOT_ID}] if at_bot else [],
    }
    if staff_id:
        data["senderStaffId"] = staff_id
    if conversation_type == "2":
        data["conversationTitle"] = title
    return data
