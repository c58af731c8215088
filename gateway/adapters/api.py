"""The local HTTP API: an OpenAI-compatible `POST /v1/chat/completions`, a simple
`POST /v1/messages` webhook, and `GET /health` / `GET /metrics`.

A request is answered when its turn's reply is ready (the reply has been stored by then), so
a 200 OK means the exchange is in state.db. The session is chosen by the
`X-Switchboard-Session` header or the `user` field; history comes from state.db, never from
the request. Off loopback a bearer key is required.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from aiohttp import web

from gateway.adapters.base import Emit
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.session_keys import CHAT_TYPES, SessionSource
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.api")
MAX_BODY = 2 * 1024 * 1024


def _bad(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error"}}, status=status
    )


class ApiAdapter:
    platform: ClassVar[str] = "api"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8642,
        key: str | None = None,
        *,
        reply_timeout_s: float = 330.0,
        health: Callable[[], dict[str, Any]] | None = None,
        metrics: Callable[[], str] | None = None,
        routes: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] | None = None,
    ) -> None:
        # extra POST endpoints other adapters serve here (Slack's Events API); they
        # authenticate their own callers (Slack signs), so the bearer key does not apply
        self._routes = dict(routes or {})
        self.host = host
        self.port = port
        self._key = key
        self._reply_timeout = reply_timeout_s
        self._health = health
        self._metrics = metrics
        self._emit: Emit | None = None
        self._pending: dict[str, asyncio.Future[OutboundMessage]] = {}
        self._runner: web.AppRunner | None = None
        self._counter = itertools.count(1)
        self.state: str = AdapterState.STOPPED
        self.bound_port: int | None = None

    # --- lifecycle -------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._auth])
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/health", self._health_view)
        app.router.add_get("/metrics", self._metrics_view)
        for path, handler in self._routes.items():
            app.router.add_post(path, handler)
        return app

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        self._runner = web.AppRunner(self.app(), shutdown_timeout=2.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.bound_port = sockets[0].getsockname()[1] if sockets else self.port
        self.state = AdapterState.RUNNING
        log.info("api listening on http://%s:%s", self.host, self.bound_port)

    async def stop(self) -> None:
        self.state = AdapterState.STOPPED
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "port": self.bound_port,
            "waiting_requests": len(self._pending),
        }

    # --- Adapter interface -------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> SentRef:
        fut = self._pending.get(msg.reply_to or "")
        if fut is not None and not fut.done():
            fut.set_result(msg)
        return SentRef(self.platform, msg.chat_id, (msg.reply_to or "",))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        return None  # HTTP clients have no threads

    # --- HTTP ----------------------------------------------------------------------------

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self._key is not None and request.path != "/health" and request.path not in self._routes:
            header = request.headers.get("Authorization", "")
            token = header[7:] if header.startswith("Bearer ") else ""
            if not hmac.compare_digest(token.encode(), self._key.encode()):
                return _bad(401, "a valid bearer key is required")
        return await handler(request)

    async def _health_view(self, request: web.Request) -> web.Response:
        body = self._health() if self._health else {"status": "ok"}
        return web.json_response(body, status=200 if body.get("status") == "ok" else 503)

    async def _metrics_view(self, request: web.Request) -> web.Response:
        text = self._metrics() if self._metrics else ""
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _read_json(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            return _bad(400, "the body must be JSON")
        if not isinstance(body, dict):
            return _bad(400, "the body must be a JSON object")
        return body

    async def _turn(
        self, source: SessionSource, text: str, message_id: str | None
    ) -> OutboundMessage | web.Response:
        if self._emit is None or self.state != AdapterState.RUNNING:
            return _bad(503, "the gateway is not accepting messages")
        rid = message_id or f"req-{uuid.uuid4().hex}"
        fut: asyncio.Future[OutboundMessage] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self._emit(
                InboundMessage(
                    source=source, text=text, platform_message_id=rid, received_at=time.time()
                )
            )
            return await asyncio.wait_for(fut, self._reply_timeout)
        except TimeoutError:
            return _bad(504, "no reply in time; the message was stored")
        except asyncio.CancelledError:
            if fut.cancelled():
                return _bad(503, "the gateway is shutting down")
            raise
        finally:
            self._pending.pop(rid, None)

    async def _chat_completions(self, request: web.Request) -> web.Response:
        body = await self._read_json(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _bad(400, "messages must be a non-empty list")
        last = messages[-1]
        if not isinstance(last, dict) or last.get("role") != "user":
            return _bad(400, "the last message must have role 'user'")
        content = last.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "\n".join(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        if not isinstance(content, str) or not content.strip():
            return _bad(400, "the last user message has no text")
        who = request.headers.get("X-Switchboard-Session") or body.get("user") or "default"
        if not isinstance(who, str) or not who.strip() or len(who) > 200:
            return _bad(
                400,
                "user / X-Switchboard-Session must be a non-empty string of at most 200 characters",
            )
        source = SessionSource(
            platform="api", chat_id=who, chat_type=ChatType.DM, user_id=who, user_name=who
        )
        out = await self._turn(source, content, request.headers.get("X-Request-Id"))
        if isinstance(out, web.Response):
            return out
        if out.error == "storage":  # not stored: never answer 200 for it
            return _bad(503, out.text)
        return web.json_response({
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "switchboard",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            "switchboard": {"session_id": out.session_id, "session_key": out.session_key},
        })  # fmt: skip

    async def _messages(self, request: web.Request) -> web.Response:
        body = await self._read_json(request)
        if isinstance(body, web.Response):
            return body
        text = body.get("text")
        chat_id = body.get("chat_id")
        if not isinstance(text, str) or not text.strip():
            return _bad(400, "text must be a non-empty string")
        if (
            not isinstance(chat_id, (str, int))
            or isinstance(chat_id, bool)
            or not str(chat_id).strip()
        ):
            return _bad(400, "chat_id is required")
        chat_type = body.get("chat_type", ChatType.DM)
        if chat_type not in CHAT_TYPES:
            return _bad(400, f"chat_type must be one of {', '.join(CHAT_TYPES)}")
        opt = {}
        for name in ("user_id", "user_name", "chat_name", "thread_id", "message_id"):
            v = body.get(name)
            if v is not None and not isinstance(v, (str, int)):
                return _bad(400, f"{name} must be a string")
            opt[name] = None if v is None else str(v)
        source = SessionSource(
            platform="api", chat_id=str(chat_id), chat_type=chat_type,
            user_id=opt["user_id"] or (str(chat_id) if chat_type == ChatType.DM else None),
            user_name=opt["user_name"], chat_name=opt["chat_name"], thread_id=opt["thread_id"],
        )  # fmt: skip
        out = await self._turn(source, text, opt["message_id"])
        if isinstance(out, web.Response):
            return out
        if out.error == "storage":  # not stored: never answer 200 for it
            return _bad(503, out.text)
        return web.json_response(
            {"reply": out.text, "session_id": out.session_id, "session_key": out.session_key}
        )
