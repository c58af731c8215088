"""A loopback fake of WeCom's AI bot long connection: a websocket speaking its frames
(`aibot_subscribe` checked against the bot id and secret, `ping`, `aibot_respond_msg`
under a callback's req_id, `aibot_send_msg`), pushing `aibot_msg_callback` frames, and,
as WeCom does, closing an older connection of the bot with a `disconnected_event` when a
newer one subscribes.

`outage` (the shared failure-injection switch) fails the two send frames. A websocket
carries no HTTP status, so each injected failure is what WeCom really does on the long
connection: a 5xx is the answer frame's errcode -1 ("system busy"), a 429 errcode 45009
("api freq out of limit"; WeCom names no wait), a 403 errcode 60011 (no privilege), a 400
errcode 40008 (invalid message type), a reset the connection dropped with no answer (the
bot reconnects and subscribes again), and a timeout no answer for the seconds given, then
errcode -1."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes import Outage, wait_for_count

BOT_ID = "aibFAKEbot"
SECRET = "fake-wecom-secret"
ENV = {"WECOM_BOT_ID": BOT_ID, "WECOM_SECRET": SECRET}
BAD_CREDENTIALS = 40001
REQ_ID_GONE = 600039  # the fake's answer to a reply under a req_id it no longer takes
SENDS = ("aibot_respond_msg", "aibot_send_msg")
SYSTEM_BUSY = (-1, "system busy")
# the answer frame's (errcode, errmsg) for an injected status
INJECTED = {
    429: (45009, "api freq out of limit"),
    403: (60011, "no privilege to access/modify contact/party/agent"),
    400: (40008, "invalid message type"),
}


def text_message(
    text: str,
    *,
    msg_id: str = "msg1",
    user: str = "alice",
    chat_id: str | None = None,
    bot_name: str = "helper",
) -> dict[str, Any]:
    """A message callback's body: a single chat, or with `chat_id` a group (whose text
    starts with the @mention WeCom requires for a group message to reach the bot)."""
    body: dict[str, Any] = {
        "msgid": msg_id,
        "aibotid": BOT_ID,
        "chattype": "group" if chat_id else "single",
        "from": {"userid": user},
        "create_time": int(time.time()),
        "msgtype": "text",
        "text": {"content": f"@{bot_name} {text}" if chat_id else text},
    }
    if chat_id:
        body["chatid"] = chat_id
    return body


@dataclass
class FakeWeCom:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    secret: str = SECRET
    answer_pings: bool = True
    hold: asyncio.Event | None = None  # when given, send frames are answered once it is set
    port: int = 0
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    subscribed: list[web.WebSocketResponse] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)  # every frame of the bot's
    pings: int = 0
    failures: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    callbacks: set[str] = field(default_factory=set)  # req_ids the bot may reply under
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None
    _transports: dict[web.WebSocketResponse, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/", self._connect)
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

    # --- what the tests read and drive ----------------------------------------------------

    def fail_next(self, cmd: str, errcode: int, errmsg: str = "refused") -> None:
        """The next `cmd` frame ("aibot_respond_msg", "aibot_send_msg") is answered so."""
        self.failures.setdefault(cmd, []).append((errcode, errmsg))

    def sent(self) -> list[tuple[str, str, str]]:
        """(how, where, text) of every message WeCom took: ("reply", the callback's
        req_id, content) or ("send", chatid, content)."""
        out = []
        for call in self.calls:
            body = call.get("body") or {}
            if not call.get("ok"):
                continue
            if call["cmd"] == "aibot_respond_msg":
                out.append(("reply", call["headers"]["req_id"], body["stream"]["content"]))
            elif call["cmd"] == "aibot_send_msg":
                out.append(("send", body["chatid"], body["markdown"]["content"]))
        return out

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[tuple[str, str, str]]:
        return await wait_for_count(self.sent, n, timeout, "WeCom messages")

    async def wait_connected(self, count: int = 1, timeout: float = 10.0) -> None:
        def ready() -> list[int]:
            live = self.subscribed and not self.subscribed[-1].closed
            return [1] if len(self.subscribed) >= count and live else []

        await wait_for_count(ready, 1, timeout, f"{count} subscribed connections")

    async def push(self, body: dict[str, Any]) -> str:
        """A message callback on the newest subscribed connection; returns its req_id."""
        req_id = f"cb-{next(self._ids)}"
        self.callbacks.add(req_id)
        frame = {"cmd": "aibot_msg_callback", "headers": {"req_id": req_id}, "body": body}
        await self.subscribed[-1].send_str(json.dumps(frame))
        return req_id

    async def event(self, event_type: str) -> None:
        frame = {
            "cmd": "aibot_event_callback",
            "headers": {"req_id": f"ev-{next(self._ids)}"},
            "body": {"msgtype": "event", "aibotid": BOT_ID, "event": {"eventtype": event_type}},
        }
        await self.subscribed[-1].send_str(json.dumps(frame))

    async def drop(self) -> None:
        """Close the newest connection without a word (a network fault)."""
        await self.subscribed[-1].close()

    # --- the connection -----------------------------------------------------------------------

    async def _connect(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.append(ws)
        self._transports[ws] = request.transport
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            await self._frame(ws, data)
        return ws

    async def _answer(
        self, ws: web.WebSocketResponse, req_id: str, errcode: int = 0, errmsg: str = "ok"
    ) -> None:
        await ws.send_str(
            json.dumps({"headers": {"req_id": req_id}, "errcode": errcode, "errmsg": errmsg})
        )

    async def _frame(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> None:
        cmd, req_id = data.get("cmd"), data["headers"]["req_id"]
        if cmd == "ping":
            self.pings += 1
            if self.answer_pings:
                await self._answer(ws, req_id)
            return
        self.calls.append(data)
        if cmd == "aibot_subscribe":
            body = data["body"]
            if (body.get("bot_id"), body.get("secret")) != (BOT_ID, self.secret):
                await self._answer(ws, req_id, BAD_CREDENTIALS, "invalid secret")
                await ws.close()
                return
            for older in [s for s in self.subscribed if not s.closed]:
                await older.send_str(
                    json.dumps(
                        {
                            "cmd": "aibot_event_callback",
                            "headers": {"req_id": f"ev-{next(self._ids)}"},
                            "body": {
                                "msgtype": "event",
                                "event": {"eventtype": "disconnected_event"},
                            },
                        }
                    )
                )
                await older.close()
            self.subscribed.append(ws)
            data["ok"] = True
            await self._answer(ws, req_id)
            return
        if ws not in self.subscribed:
            await self._answer(ws, req_id, 40001, "not subscribed")
            return
        if cmd in SENDS and await self._injected(ws, req_id):
            data["ok"] = False
            return
        failures = self.failures.get(str(cmd))
        if failures:
            data["ok"] = False
            await self._answer(ws, req_id, *failures.pop(0))
            return
        if cmd == "aibot_respond_msg" and req_id not in self.callbacks:
            data["ok"] = False
            await self._answer(ws, req_id, REQ_ID_GONE, "invalid req_id")
            return
        data["ok"] = cmd in SENDS
        if self.hold is not None and data["ok"]:
            await self.hold.wait()
        await self._answer(ws, req_id, 0 if data["ok"] else 40008, "ok" if data["ok"] else "?")

    async def _injected(self, ws: web.WebSocketResponse, req_id: str) -> bool:
        """Answer this send frame with the outage's failure; False when there is none."""
        failure = self.outage.take()
        if failure is None:
            return False
        self.outage.failed += 1
        kind, _, arg = failure.partition(":")
        if kind == "reset":
            transport = self._transports.get(ws)
            if transport is not None:
                transport.abort()  # the connection drops, the frame unanswered
            return True
        if kind == "timeout":
            await asyncio.sleep(float(arg or 30))
            await self._answer(ws, req_id, *SYSTEM_BUSY)
            return True
        await self._answer(ws, req_id, *INJECTED.get(int(kind), SYSTEM_BUSY))
        return True
