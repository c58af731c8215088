"""A loopback fake of QQ Bot's API v2: the app access token service, GET /gateway and
/users/@me, the websocket gateway (Hello, Identify or Resume, READY / RESUMED, heartbeats
and their acks, dispatches with sequence numbers, a Resume replaying what came after the
number it names, Reconnect and Invalid Session on request), and the two send calls with
QQ's rules: msg_id + msg_seq once, five passive replies per message, active messages
refused unless allowed, error answers as `{"code", "message", "err_code", "trace_id"}`.

`outage` (the shared failure-injection switch) fails the send calls as QQ's API answers:
a 5xx with QQ's error body (the code is the status, as QQ's gateway gives for a server
fault), a 429 with the code of "msg limit exceed" (22009; QQ names no wait), a 403 or 400
with a refusal of the message (no permission, an invalid request), a reset as a dropped
connection and a timeout as no answer, then a 504."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import Outage, connection_closer, wait_for_count

APP_ID = "102000001"
SECRET = "fake-app-secret"
ENV = {"QQBOT_APP_ID": APP_ID, "QQBOT_CLIENT_SECRET": SECRET}
BOT_NAME = "switchboard-bot"
ALICE = "A1B2C3D4E5F60718293A4B5C6D7E8F90"
BOB = "B0B0B0B0B0B0B0B0B0B0B0B0B0B0B0B0"
GROUP = "9F8E7D6C5B4A39281706F5E4D3C2B1A0"
CHANNEL = "634100987"
ACTIVE_REFUSED = {"code": 40034102, "message": "主动消息失败, 无权限"}
DEDUPED = {"code": 40054005, "message": "消息被去重，请检查请求msgseq"}
RATE_LIMITED = {"code": 22009, "message": "msg limit exceed"}


SEND_PATH = re.compile(r"^/(v2/users|v2/groups|channels)/[^/]+/messages$")
# what QQ answers to a refused send, per injected status
REFUSALS = {
    403: {"code": 11253, "message": "check app privilege not pass"},
    400: {"code": 40034001, "message": "invalid request"},
}


async def _error_answer(
    status: int, _retry_after: float | None, _request: web.Request
) -> web.StreamResponse:
    """An injected failure in QQ's error shape."""
    if status == 429:
        body: dict[str, Any] = dict(RATE_LIMITED)
    else:
        body = REFUSALS.get(status, {"code": status, "message": "internal server error"})
    trace = f"trace-injected-{status}"
    return web.json_response({**body, "err_code": body["code"], "trace_id": trace}, status=status)


@dataclass
class FakeQQ:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    secret: str = SECRET
    heartbeat_ms: int = 200
    allow_active: bool = True
    keep_alive: bool = True
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    identifies: list[dict[str, Any]] = field(default_factory=list)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: list[Any] = field(default_factory=list)
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    failures: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # every dispatch, in order
    session_id: str | None = None
    revoked: set[str] = field(default_factory=set)  # tokens QQ stopped taking before expiry
    port: int = 0
    _used: set[tuple[str, int]] = field(default_factory=set)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    token_url = api_url

    def fail_next(self, status: int, body: dict[str, Any]) -> None:
        """The next send answers `status` with `body` (QQ's error shape)."""
        self.failures.append((status, body))

    def sent(self) -> list[dict[str, Any]]:
        """Every message QQ took: {"chat", "kind", "text", "msg_type", "msg_id", "msg_seq"}."""
        return [p for k, p in self.calls if k == "send" and p.get("ok")]

    def texts(self) -> list[str]:
        return [str(p["text"]) for p in self.sent()]

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.sent, n, timeout, "QQ messages")

    def live(self) -> list[web.WebSocketResponse]:
        return [ws for ws in self.sockets if not ws.closed]

    async def wait_ready(self, count: int = 1, timeout: float = 10.0) -> web.WebSocketResponse:
        """Until `count` sessions were made ready (READY or RESUMED) and one is open."""

        def ready() -> list[int]:
            done = len(self.identifies) + len(self.resumes) >= count and self.live()
            return [1] if done and self._ready_on(self.live()[-1]) else []

        await wait_for_count(ready, 1, timeout, f"{count} ready gateway sessions")
        return self.live()[-1]

    def _ready_on(self, ws: web.WebSocketResponse) -> bool:
        return bool(getattr(ws, "_qq_ready", False))

    async def start(self) -> None:
        injecting = self.outage.middleware(
            lambda r: r.method == "POST" and SEND_PATH.match(r.path) is not None, _error_answer
        )
        app = web.Application(middlewares=[injecting, connection_closer(self)])
        app.router.add_post("/app/getAppAccessToken", self._token)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/users/@me", self._me)
        app.router.add_get("/websocket", self._socket)
        app.router.add_post("/v2/users/{openid}/messages", self._send)
        app.router.add_post("/v2/groups/{openid}/messages", self._send)
        app.router.add_post("/channels/{openid}/messages", self._send)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        for ws in list(self.sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- the gateway ----------------------------------------------------------------

    async def push(self, kind: str, data: dict[str, Any]) -> int:
        """A dispatch to the bot's session: logged with the next sequence number and sent on
        the open connection, if one is ready (else a Resume replays it)."""
        seq = len(self.events) + 1
        payload = {"op": 0, "s": seq, "t": kind, "d": data, "id": f"{kind}:{seq}"}
        self.events.append(payload)
        for ws in self.live():
            if self._ready_on(ws):
                await ws.send_json(payload)
        return seq

    async def c2c(self, text: str, user: str = ALICE, msg_id: str | None = None) -> str:
        msg_id = msg_id or f"ROBOT1.0_c2c{next(self._ids)}"
        await self.push("C2C_MESSAGE_CREATE", c2c_message(text, user, msg_id))
        return msg_id

    async def group_at(self, text: str, member: str = ALICE, group: str = GROUP) -> str:
        msg_id = f"ROBOT1.0_grp{next(self._ids)}"
        await self.push("GROUP_AT_MESSAGE_CREATE", group_message(text, member, group, msg_id))
        return msg_id

    async def guild_at(self, text: str, author: str = "10001", channel: str = CHANNEL) -> str:
        msg_id = f"08guild{next(self._ids)}"
        await self.push("AT_MESSAGE_CREATE", guild_message(text, author, channel, msg_id))
        return msg_id

    async def op(self, op: int, d: Any = None) -> None:
        """Any op on the newest connection (7 Reconnect, 9 Invalid Session...)."""
        await self.live()[-1].send_json({"op": op, "d": d})

    async def close_with(self, code: int) -> None:
        await self.live()[-1].close(code=code)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.sockets.append(ws)
        await ws.send_json({"op": 10, "d": {"heartbeat_interval": self.heartbeat_ms}})
        async for msg in ws:
            try:
                payload = json.loads(msg.data)
            except (TypeError, ValueError):
                print(f"FakeQQ: unreadable payload: {msg.data!r}", flush=True)
                continue
            await self._client_op(ws, payload)
        return ws

    async def _client_op(self, ws: web.WebSocketResponse, payload: dict[str, Any]) -> None:
        op, d = payload.get("op"), payload.get("d")
        if op == 1:
            self.heartbeats.append(d)
            await ws.send_json({"op": 11})
        elif op == 2:
            self.identifies.append(d)
            if d.get("token") not in self.valid():
                await ws.close(code=4004)
                return
            self.session_id = f"session-{len(self.identifies)}"
            ready = {
                "version": 1,
                "session_id": self.session_id,
                "user": {"id": "bot-1", "username": BOT_NAME, "bot": True},
                "shard": [0, 1],
            }
            seq = len(self.events)  # a new session starts after what was sent before it
            await ws.send_json({"op": 0, "s": seq, "t": "READY", "d": ready})
            ws._qq_ready = True  # type: ignore[attr-defined]
        elif op == 6:
            self.resumes.append(d)
            if d.get("session_id") != self.session_id or d.get("token") not in self.valid():
                await ws.send_json({"op": 9, "d": False})
                return
            for event in self.events[int(d.get("seq") or 0) :]:
                await ws.send_json(event)
            await ws.send_json({"op": 0, "s": len(self.events), "t": "RESUMED", "d": ""})
            ws._qq_ready = True  # type: ignore[attr-defined]

    # --- HTTP ---------------------------------------------------------------------------

    def _error(self, status: int, body: dict[str, Any]) -> web.Response:
        code = body.get("code", 0)
        return web.json_response(
            {**body, "err_code": code, "trace_id": f"trace-{next(self._ids)}"}, status=status
        )

    def valid(self) -> list[str]:
        """The Authorization values QQ takes now."""
        return [f"QQBot {t}" for t in self.tokens if t not in self.revoked]

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        return header in self.valid() and request.headers.get("X-Union-Appid") == APP_ID

    async def _unknown(self, request: web.Request) -> web.Response:
        print(f"FakeQQ: unimplemented {request.method} {request.path}", flush=True)
        return self._error(404, {"code": 404, "message": "not found"})

    async def _token(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("token", body))
        if (body.get("appId"), body.get("clientSecret")) != (APP_ID, self.secret):
            return web.json_response({"code": 100016, "message": "invalid appid or secret"})
        token = f"qq-token-{len(self.tokens) + 1}"
        self.tokens.append(token)
        return web.json_response({"access_token": token, "expires_in": "7200"})

    async def _gateway(self, request: web.Request) -> web.Response:
        self.calls.append(("gateway", {}))
        if not self._authorized(request):
            return self._error(401, {"code": 11244, "message": "token not exist or expire"})
        return web.json_response({"url": f"ws://127.0.0.1:{self.port}/websocket"})

    async def _me(self, request: web.Request) -> web.Response:
        self.calls.append(("me", {}))
        if not self._authorized(request):
            return self._error(401, {"code": 11244, "message": "token not exist or expire"})
        return web.json_response({"id": "bot-1", "username": BOT_NAME, "avatar": ""})

    async def _send(self, request: web.Request) -> web.Response:
        body = await request.json()
        openid = request.match_info["openid"]
        kind = "group" if "/groups/" in request.path else "c2c"
        kind = "channel" if request.path.startswith("/channels/") else kind
        markdown = body.get("msg_type") == 2 or (kind == "channel" and "markdown" in body)
        text = (body.get("markdown") or {}).get("content") if markdown else None
        record: dict[str, Any] = {
            "chat": {"group": "group-", "channel": "channel-"}.get(kind, "") + openid,
            "kind": kind,
            "text": text if text is not None else body.get("content"),
            "msg_type": body.get("msg_type"),
            "msg_id": body.get("msg_id"),
            "msg_seq": body.get("msg_seq"),
        }
        self.calls.append(("send", record))
        if not self._authorized(request):
            return self._error(401, {"code": 11244, "message": "token not exist or expire"})
        if self.failures:
            status, failure = self.failures.pop(0)
            return self._error(status, failure)
        if not record["text"]:
            return self._error(400, {"code": 50006, "message": "消息为空"})
        msg_id = body.get("msg_id")
        if msg_id and kind != "channel":  # a guild channel's reply has no msg_seq
            seq = int(body.get("msg_seq") or 1)
            if (msg_id, seq) in self._used:
                return self._error(400, DEDUPED)
            if sum(1 for m, _ in self._used if m == msg_id) >= 5:
                return self._error(400, {"code": 40034025, "message": "回复次数超过限制"})
            self._used.add((msg_id, seq))
        elif not self.allow_active:
            return self._error(400, ACTIVE_REFUSED)
        record["ok"] = True
        await asyncio.sleep(0)
        return web.json_response(
            {"id": f"ROBOT1.0_sent{next(self._ids)}", "timestamp": "2026-12-06T10:00:00+08:00"}
        )


def c2c_message(text: str, user: str = ALICE, msg_id: str = "ROBOT1.0_c2c") -> dict[str, Any]:
    """A C2C_MESSAGE_CREATE dispatch's data, as QQ sends it."""
    return {
        "author": {"user_openid": user, "union_openid": user},
        "content": text,
        "id": msg_id,
        "timestamp": "2026-12-06T09:58:00+08:00",
        "attachments": [],
        "message_scene": {"source": "default"},
    }


def group_message(
    text: str, member: str = ALICE, group: str = GROUP, msg_id: str = "ROBOT1.0_grp"
) -> dict[str, Any]:
    """A GROUP_AT_MESSAGE_CREATE dispatch's data: the @ of the bot is left out of content."""
    return {
        "author": {"member_openid": member, "union_openid": member},
        "content": f" {text}",
        "group_openid": group,
        "group_id": group,
        "id": msg_id,
        "timestamp": "2026-12-06T09:58:00+08:00",
    }


def guild_message(
    text: str, author: str = "10001", channel: str = CHANNEL, msg_id: str = "08guild"
) -> dict[str, Any]:
    """An AT_MESSAGE_CREATE dispatch's data: a guild channel keeps the bot's <@!id>."""
    return {
        "author": {"id": author, "username": "alice", "bot": False, "avatar": ""},
        "channel_id": channel,
        "guild_id": "7700112233",
        "content": f"<@!5544332211> {text}",
        "id": msg_id,
        "member": {"nick": "alice", "roles": ["1"]},
        "timestamp": "2026-12-06T09:58:00+08:00",
        "seq": 12,
        "seq_in_channel": "12",
    }
