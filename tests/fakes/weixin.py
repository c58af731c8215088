"""A loopback fake of Tencent's iLink Bot API for the Weixin adapter: the `getupdates` long
poll over a cursor (`get_updates_buf`, "buf-<position>" in the fake's message log), held
until a message comes or `hold_s` passes; `sendmessage`, which takes a message only with
a context_token given to that peer; `getconfig` (a typing ticket per user) and `sendtyping`; and the QR login's two GETs, whose
statuses are scripted. Every business call must carry the iLink headers (a bad token is
answered ret -14, as iLink does for an expired session).

`outage` (the shared failure-injection switch) fails `sendmessage` as iLink answers: a 5xx
as that HTTP status; its business errors as HTTP 200 with a nonzero `ret`, so a 429 is
ret -2 (iLink's frequency limit, which names no wait) and a 403 or 400 is ret -1 with the
reason (the message refused); a reset drops the connection unanswered."""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import Outage, connection_closer, wait_for_count

TOKEN = "fake-ilink-bot-token"
BOT_ID = "b0f5e7c1@im.bot"
OWNER = "o9cq80owner@im.wechat"
ENV = {"WEIXIN_TOKEN": TOKEN}
ALICE = "o9cq80alice@im.wechat"
BOB = "o9cq80bob@im.wechat"


# iLink's answer (HTTP 200) for an injected status below 500
INJECTED = {
    429: {"ret": -2, "errmsg": "frequency limit"},
    403: {"ret": -1, "errmsg": "no permission to message this user"},
    400: {"ret": -1, "errmsg": "bad msg"},
}


async def _error(status: int, _retry_after: float | None, _request: web.Request) -> web.Response:
    if status >= 500:
        return web.json_response({"ret": -1, "errmsg": "system error"}, status=status)
    return web.json_response(INJECTED.get(status, {"ret": -1, "errmsg": f"error {status}"}))


@dataclass
class FakeWeixin:
    outage: Outage = field(default_factory=Outage)  # failures injected into sendmessage
    token: str = TOKEN
    hold_s: float = 0.5  # how long a getupdates with nothing new is held
    batch: int = 10  # messages per getupdates answer at most
    keep_alive: bool = True
    log: list[dict[str, Any]] = field(default_factory=list)  # every message, in order
    polls: list[str] = field(default_factory=list)  # the cursor of each getupdates
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    header_problems: list[str] = field(default_factory=list)
    contexts: dict[str, str] = field(default_factory=dict)  # chat -> latest context_token
    issued: dict[str, set[str]] = field(default_factory=dict)  # chat -> every token given
    failures: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    qr_statuses: list[dict[str, Any]] = field(default_factory=list)
    qr_issued: list[str] = field(default_factory=list)
    typing: list[tuple[str, int]] = field(default_factory=list)  # (peer, 1 on / 2 off)
    port: int = 0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(7_000_001))
    _new: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- what a test does ----------------------------------------------------------------

    def say(
        self, user: str, text: str, *, group: str | None = None, msg_id: int | None = None
    ) -> dict[str, Any]:
        """`user` writes `text` to the bot (in `group`, when given): a message in the log
        with a fresh context_token for that user. The same `msg_id` again is a redelivery."""
        number = msg_id if msg_id is not None else next(self._ids)
        token = f"ctx-{user.split('@')[0]}-{number}-{len(self.log)}"
        chat = group or user  # where a reply to it goes
        self.contexts[chat] = token
        self.issued.setdefault(chat, set()).add(token)
        msg: dict[str, Any] = {
            "seq": len(self.log) + 1,
            "message_id": number,
            "from_user_id": user,
            "to_user_id": BOT_ID,
            "client_id": f"wx-{number}",
            "create_time_ms": int(time.time() * 1000),
            "session_id": "",
            "message_type": 1,
            "message_state": 2,
            "context_token": token,
            "item_list": [{"type": 1, "text_item": {"text": text}}],
        }
        if group:
            msg["group_id"] = group
        self.log.append(msg)
        self._new.set()
        return msg

    def fail_next(self, call: str, status: int, body: dict[str, Any] | None = None) -> None:
        """The next `call` ("sendmessage", "getupdates", "getconfig") answers `status`
        with `body` (a JSON object; iLink's errors come as HTTP 200 with a nonzero ret)."""
        self.failures.setdefault(call, []).append((status, body or {}))

    def sent(self) -> list[dict[str, Any]]:
        """The `msg` of every message the fake took, in order."""
        return [
            body["msg"] for name, body in self.calls if name == "sendmessage" and body.get("ok")
        ]

    def texts(self) -> list[str]:
        return [m["item_list"][0]["text_item"]["text"] for m in self.sent()]

    async def wait_sent(self, n: int, timeout: float = 15.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.sent, n, timeout, "Weixin messages")

    async def wait_polls(self, n: int, timeout: float = 15.0) -> list[str]:
        return await wait_for_count(lambda: self.polls, n, timeout, "getupdates polls")

    # --- the server ----------------------------------------------------------------------

    async def start(self) -> None:
        injecting = self.outage.middleware(lambda r: r.path == "/ilink/bot/sendmessage", _error)
        app = web.Application(middlewares=[injecting, connection_closer(self)])
        app.router.add_post("/ilink/bot/getupdates", self._getupdates)
        app.router.add_post("/ilink/bot/sendmessage", self._sendmessage)
        app.router.add_post("/ilink/bot/getconfig", self._getconfig)
        app.router.add_post("/ilink/bot/sendtyping", self._sendtyping)
        app.router.add_get("/ilink/bot/get_bot_qrcode", self._qrcode)
        app.router.add_get("/ilink/bot/get_qrcode_status", self._qrcode_status)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _business(
        self, request: web.Request, name: str
    ) -> tuple[dict[str, Any], web.Response | None]:
        """The request's body, or the answer that refuses it (bad headers, a bad token, a
        scripted failure)."""
        body = await request.json()
        self.calls.append((name, body))
        problems = self._check_headers(request, body)
        if problems:
            self.header_problems += problems
            return body, web.json_response({"ret": -1, "errmsg": "; ".join(problems)}, status=400)
        if request.headers["Authorization"] != f"Bearer {self.token}":
            return body, web.json_response(
                {"ret": -14, "errcode": -14, "errmsg": "session timeout"}
            )
        queued = self.failures.get(name)
        if queued:
            status, answer = queued.pop(0)
            return body, web.json_response(answer, status=status)
        return body, None

    @staticmethod
    def _check_headers(request: web.Request, body: dict[str, Any]) -> list[str]:
        problems = []
        if request.headers.get("AuthorizationType") != "ilink_bot_token":
            problems.append("AuthorizationType must be ilink_bot_token")
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            problems.append("Authorization must be Bearer <token>")
        try:
            int(base64.b64decode(request.headers.get("X-WECHAT-UIN", ""), validate=True).decode())
        except ValueError:
            problems.append("X-WECHAT-UIN must be a base64-encoded decimal number")
        if not isinstance(body.get("base_info"), dict) or not body["base_info"].get(
            "channel_version"
        ):
            problems.append("base_info.channel_version is missing")
        return problems

    async def _getupdates(self, request: web.Request) -> web.Response:
        body, refused = await self._business(request, "getupdates")
        if refused is not None:
            return refused
        cursor = str(body.get("get_updates_buf") or "")
        self.polls.append(cursor)
        start = int(cursor.removeprefix("buf-")) if cursor.startswith("buf-") else 0
        if start >= len(self.log):
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), self.hold_s)
            except TimeoutError:
                return web.json_response({"ret": 0, "msgs": [], "get_updates_buf": cursor})
        batch = self.log[start : start + self.batch]
        wire = [{k: v for k, v in m.items() if k != "seq"} for m in batch]
        return web.json_response(
            {
                "ret": 0,
                "msgs": wire,
                "get_updates_buf": f"buf-{start + len(batch)}",
                "longpolling_timeout_ms": 35_000,
            }
        )

    async def _sendmessage(self, request: web.Request) -> web.Response:
        body, refused = await self._business(request, "sendmessage")
        if refused is not None:
            return refused
        msg = body.get("msg") or {}
        peer = msg.get("to_user_id")
        if msg.get("context_token") not in self.issued.get(peer, set()):
            return web.json_response({"ret": -1, "errmsg": "invalid context_token"})
        item = (msg.get("item_list") or [{}])[0]
        if msg.get("message_type") != 2 or item.get("type") != 1 or not msg.get("client_id"):
            return web.json_response({"ret": -1, "errmsg": "bad msg"})
        body["ok"] = True
        return web.json_response({"ret": 0})

    async def _getconfig(self, request: web.Request) -> web.Response:
        body, refused = await self._business(request, "getconfig")
        if refused is not None:
            return refused
        user = body.get("ilink_user_id") or ""
        return web.json_response({"ret": 0, "typing_ticket": f"ticket-{user.split('@')[0]}"})

    async def _sendtyping(self, request: web.Request) -> web.Response:
        body, refused = await self._business(request, "sendtyping")
        if refused is not None:
            return refused
        user = str(body.get("ilink_user_id") or "")
        if body.get("typing_ticket") != f"ticket-{user.split('@')[0]}" or body.get(
            "status"
        ) not in (1, 2):
            return web.json_response({"ret": -1, "errmsg": "bad typing ticket or status"})
        self.typing.append((user, int(body["status"])))
        return web.json_response({"ret": 0})

    async def _qrcode(self, request: web.Request) -> web.Response:
        self.calls.append(("get_bot_qrcode", dict(request.query)))
        code = f"qr-{len(self.qr_issued) + 1}"
        self.qr_issued.append(code)
        return web.json_response(
            {"qrcode": code, "qrcode_img_content": f"https://liteapp.weixin.qq.com/q/{code}"}
        )

    async def _qrcode_status(self, request: web.Request) -> web.Response:
        self.calls.append(("get_qrcode_status", dict(request.query)))
        if request.query.get("qrcode") != (self.qr_issued[-1] if self.qr_issued else None):
            return web.json_response({"status": "expired"})
        status = self.qr_statuses.pop(0) if self.qr_statuses else {"status": "wait"}
        if status.get("status") == "confirmed":
            status = {
                "bot_token": self.token,
                "ilink_bot_id": BOT_ID,
                "ilink_user_id": OWNER,
                "baseurl": self.base_url,
                **status,
            }
        return web.json_response(status)
