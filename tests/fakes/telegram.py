"""A loopback fake of the Telegram Bot API, driven by the real python-telegram-bot.

Every call is recorded; tests push updates (builders below) and script failures
(429 with retry_after, 5xx, dropped long polls). Once a bot calls setWebhook, pending
updates are POSTed to its URL instead, as Telegram does: oldest first, one at a time, and an
update answered with anything but 2xx (or not answered) is posted again until it is."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import Outage, wait_for_count

BOT = {"id": 4242, "is_bot": True, "first_name": "Switchboard", "username": "switchboard_bot"}


@dataclass
class FakeTelegram:
    token: str = "123:ABC"
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    forum_chats: set[int] = field(default_factory=set)
    port: int = 0
    _runner: web.AppRunner | None = None
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _closing: bool = False
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _update_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    webhook_url: str | None = None
    webhook_secret: str | None = None
    # every webhook POST: (update_id, the HTTP status, None when the connection failed)
    webhook_attempts: list[tuple[int, int | None]] = field(default_factory=list)
    _deliverer: asyncio.Task[None] | None = None
    keep_alive: bool = True  # False: every answer closes its connection (the next call connects)
    outage: Outage = field(default_factory=Outage)  # failures injected into sendMessage
    posted: list[dict[str, Any]] = field(default_factory=list)  # the messages sendMessage made
    results: dict[str, list[Any]] = field(default_factory=dict)  # scripted 200 answers

    # --- driving -----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    def fail_next(self, method: str, status: int, **parameters: Any) -> None:
        """The next call of `method` answers `status` (with Bot API `parameters`)."""
        self.failures.setdefault(method, []).append((status, parameters))

    def answer_next(self, method: str, result: Any) -> None:
        """The next call of `method` answers 200 with this `result`, whatever it is."""
        self.results.setdefault(method, []).append(result)

    def push(
        self, message: dict[str, Any], update_id: int | None = None, kind: str = "message"
    ) -> int:
        uid = next(self._update_ids) if update_id is None else update_id
        return self.push_raw({kind: message}, uid)

    def push_raw(self, body: dict[str, Any], update_id: int | None = None) -> int:
        """An update of any shape (a malformed one too) under the next update_id."""
        uid = next(self._update_ids) if update_id is None else update_id
        self.updates.append({"update_id": uid, **body})
        self._wakeup.set()
        self._wakeup = asyncio.Event()
        return uid

    def sent(self, method: str = "sendMessage") -> list[dict[str, Any]]:
        return [params for name, params in self.calls if name == method]

    async def wait_sent(
        self, n: int, method: str = "sendMessage", timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        return await wait_for_count(lambda: self.sent(method), n, timeout, f"{method} calls")

    # --- payload builders ---------------------------------------------------------------

    def message(
        self,
        text: str,
        chat: dict[str, Any],
        user_id: int = 7,
        name: str = "Ann",
        thread: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        msg: dict[str, Any] = {
            "message_id": next(self._ids),
            "date": int(time.time()),
            "text": text,
            "chat": chat,
            "from": {"id": user_id, "is_bot": False, "first_name": name},
        }
        if thread is not None:
            msg["message_thread_id"] = thread
            msg["is_topic_message"] = True
        msg.update(extra)
        return msg

    @staticmethod
    def dm_chat(user_id: int = 7) -> dict[str, Any]:
        return {"id": user_id, "type": "private", "first_name": "Ann"}

    @staticmethod
    def group_chat(chat_id: int = -100111, forum: bool = False) -> dict[str, Any]:
        return {"id": chat_id, "type": "supergroup", "title": "Team", "is_forum": forum}

    # --- server ---------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(
            middlewares=[
                self.outage.middleware(
                    lambda r: r.path.endswith("/sendMessage"), self._error_answer
                )
            ]
        )
        app.router.add_post("/bot{token}/{method}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)  # 0: any free port
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        self._closing = True
        self._wakeup.set()
        if self._deliverer is not None:
            self._deliverer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._deliverer
        if self._runner is not None:
            await self._runner.cleanup()

    @classmethod
    async def _error_answer(
        cls, status: int, retry_after: float | None, _request: web.Request
    ) -> web.Response:
        """An injected failure as the Bot API words it (429: parameters.retry_after)."""
        words = {
            403: "Forbidden: bot was blocked by the user",
            429: "Too Many Requests",
            503: "Service Unavailable",
            504: "Gateway Timeout",
        }
        body: dict[str, Any] = {
            "ok": False,
            "error_code": status,
            "description": words.get(status, "Bad Gateway"),
        }
        if retry_after is not None:
            body["parameters"] = {"retry_after": max(1, round(retry_after))}  # whole seconds
        return cls._reply(status, body)

    @staticmethod
    def _reply(status: int, body: dict[str, Any]) -> web.Response:
        return web.Response(
            status=status, body=json.dumps(body).encode(), content_type="application/json"
        )

    async def _handle(self, request: web.Request) -> web.Response:
        response = await self._answer(request)
        if not self.keep_alive:
            response.force_close()
        return response

    async def _answer(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if request.match_info["token"] != self.token:
            return self._reply(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
        params: dict[str, Any] = {}
        if request.can_read_body:
            form = await request.post()
            for key, value in form.items():
                try:
                    params[key] = json.loads(value)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    params[key] = value
        self.calls.append((method, params))
        if self.results.get(method):
            return self._reply(200, {"ok": True, "result": self.results[method].pop(0)})
        queued = self.failures.get(method)
        if queued:
            status, parameters = queued.pop(0)
            body: dict[str, Any] = {
                "ok": False,
                "error_code": status,
                "description": f"scripted {status}",
            }
            if parameters:
                body["parameters"] = parameters
            return self._reply(status, body)
        if method == "createForumTopic" and int(params.get("chat_id", 0)) not in self.forum_chats:
            return self._reply(
                400,
                {
                    "ok": False,
                    "error_code": 400,
                    "description": "Bad Request: the chat is not a forum",
                },
            )
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            print(f"FakeTelegram: unimplemented method {method}", flush=True)
            return self._reply(404, {"ok": False, "error_code": 404, "description": "Not Found"})
        return self._reply(200, {"ok": True, "result": await handler(params)})

    async def _m_getMe(self, params: dict[str, Any]) -> Any:
        return BOT

    async def _m_deleteWebhook(self, params: dict[str, Any]) -> Any:
        self.webhook_url = None
        if params.get("drop_pending_updates"):
            self.updates.clear()
        return True

    async def _m_getUpdates(self, params: dict[str, Any]) -> Any:
        offset = int(params.get("offset") or 0)
        self.updates = [u for u in self.updates if u["update_id"] >= offset]  # confirmed ones go
        if not self.updates and not self._closing:
            try:
                await asyncio.wait_for(
                    self._wakeup.wait(), float(params.get("timeout") or 0) or 0.01
                )
            except TimeoutError:
                pass
        return [u for u in self.updates if u["update_id"] >= offset]

    async def _m_sendMessage(self, params: dict[str, Any]) -> Any:
        msg = {
            "message_id": next(self._ids),
            "date": int(time.time()),
            "text": params.get("text", ""),
            "chat": {"id": int(params["chat_id"]), "type": "private"},
            "from": BOT,
        }
        if params.get("message_thread_id"):
            msg["message_thread_id"] = params["message_thread_id"]
            msg["is_topic_message"] = True
        self.posted.append(msg)
        return msg

    async def _m_setWebhook(self, params: dict[str, Any]) -> Any:
        self.webhook_url = str(params["url"])
        self.webhook_secret = params.get("secret_token")
        if self._deliverer is None:
            self._deliverer = asyncio.create_task(self._deliver(), name="fake-telegram.webhook")
        return True

    async def _deliver(self) -> None:
        """Telegram's side of a webhook: the oldest pending update is POSTed with the secret
        header; only a 2xx answer removes it, anything else (a 503, a dropped connection)
        posts it again after a short pause."""
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while not self._closing:
                wakeup = self._wakeup
                if not self.updates or self.webhook_url is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wakeup.wait(), 0.05)
                    continue
                update = self.updates[0]
                headers = {"X-Telegram-Bot-Api-Secret-Token": str(self.webhook_secret or "")}
                status: int | None
                try:
                    async with http.post(self.webhook_url, json=update, headers=headers) as resp:
                        status = resp.status
                except (aiohttp.ClientError, TimeoutError):
                    status = None
                self.webhook_attempts.append((update["update_id"], status))
                if status is not None and 200 <= status < 300:
                    if self.updates and self.updates[0] is update:
                        self.updates.pop(0)
                else:
                    await asyncio.sleep(0.05)

    async def _m_sendChatAction(self, params: dict[str, Any]) -> Any:
        return True

    async def _m_createForumTopic(self, params: dict[str, Any]) -> Any:
        return {
            "message_thread_id": next(self._ids),
            "name": params.get("name"),
            "icon_color": 7322096,
        }
