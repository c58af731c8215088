"""The local HTTP API: an OpenAI-compatible `POST /v1/chat/completions` (plain JSON or
server-sent events) and `GET /v1/models`, a simple `POST /v1/messages` webhook, and
`GET /health` / `GET /metrics`.

A request is answered when its turn's reply is ready (the reply has been stored by then), so
a 200 OK means the exchange is in state.db. The session is chosen by the
`X-Switchboard-Session` header or the `user` field; history comes from state.db, never from
the request. Off loopback a bearer key is required. Every error is JSON in OpenAI's shape,
`{"error": {"message", "type", "code"}}`. An `Idempotency-Key` header makes a request safe to
repeat, across restarts too: a repeat gets the first answer (`Idempotent-Replayed: true`)
from memory or from the store, never a second turn.

What is sent for a request after its answer (a /background job's result) comes in the
`notices` of that chat's next answer, and is also POSTed to the request's `callback_url`
when it gave one. Such follow-ups are held in memory by the process that ran the job.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp
from aiohttp import web

from gateway.adapters.base import Emit
from gateway.errors import NotAccepted
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.session_keys import CHAT_TYPES, SessionSource
from gateway.vocab import AdapterState, ChatType
from state import unstorable

if TYPE_CHECKING:
    from state import StoredReply

log = logging.getLogger("gateway.adapters.api")
MAX_BODY = 2 * 1024 * 1024
ANSWERED_MEMORY = 10_000  # recent answers kept to reply to a redelivered message_id at once
FOLLOWUPS_PER_CHAT = 20  # follow-ups (background results) a chat's next answer carries at most
CALLBACK_TIMEOUT_S = 10.0
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"  # "true" on an answer given again, not a new turn
MAX_KEY = 255
# (chat_id, key) -> the stored user message and its reply, read from the store
StoredReplies = Callable[[str, str], Awaitable["StoredReply | None"]]
# (platform, chat id or chat_id:thread_id or None for the home channel, text) -> the outbox
# row's outcome: {"id", "platform", "chat_id", "message_ids", "state": sent | pending}
SendOne = Callable[[str, "str | None", str], Awaitable[dict[str, Any]]]

# the kinds of answer a request can end with, besides a reply: (status, type, code, message)
_DROPPED = {
    "duplicate": (409, "duplicate_message", "this message_id was already received for this "
                  "chat; its reply is in the session's history"),
    "unauthorised": (403, "not_allowed", "this user may not use the gateway"),
    "shutting_down": (503, "shutting_down", "the gateway is shutting down"),
    "not_accepted": (503, "storage_unavailable", "the gateway could not store your message; "
                     "send it again (with the same Idempotency-Key)"),
    "unstorable": (400, "unstorable_input", "the message holds a value the store can never "
                   "keep; nothing was stored, and sending it again cannot help"),
    "in_flight": (409, "in_flight", "this message id is stored and its turn has not answered "
                  "yet (it runs, or runs again after a restart); ask again later for its reply"),
    "answered_elsewhere": (409, "answered_elsewhere", "another replica answered this message "
                           "and its answer (a command's) is not stored"),
}  # fmt: skip
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "invalid_request_error", 429: "rate_limit_error"}  # fmt: skip


# the seconds a 503 asks its sender to wait before delivering again: the store's
# reconnects are tried every half second, and it answers within a second of returning
RETRY_AFTER_S = "1"


def _error(status: int, message: str, code: str | None = None) -> web.Response:
    """An error in OpenAI's shape; the type follows from the status (5xx: server_error)."""
    kind = "server_error" if status >= 500 else _ERROR_TYPES.get(status, "invalid_request_error")
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": code}}, status=status
    )


def _bad(status: int, message: str) -> web.Response:
    return _error(status, message, "invalid_request" if status == 400 else None)


def _json_type(value: object) -> str:
    """The JSON type of a decoded value, as an error message names it."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "a string"


def _usage(out: OutboundMessage) -> tuple[dict[str, int], str]:
    """The OpenAI `usage` of an answer and where its figures come from: "agent" (the
    backend's counts), "estimate" (ours, about 4 characters a token: the echo agent, or a
    backend that reports none) or "none" (no agent call answered this request: a command,
    or an answer read back from the store)."""
    u = out.usage
    if u is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "none"
    counts = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
              "total_tokens": u.prompt_tokens + u.completion_tokens}  # fmt: skip
    return counts, "estimate" if u.estimated else "agent"


def _refused_text(fields: dict[str, str]) -> web.Response | None:
    """A 400 naming the first field whose text no store can hold (state/text.py: NUL, a
    lone surrogate, which JSON's "\\ud800" allows), else None."""
    for name, value in fields.items():
        why = unstorable(value)
        if why is not None:
            return _bad(400, f"{name} {why}")
    return None


@dataclass
class _Exchange:
    """One request's answer as the router sends it: notices first, then the reply (or the
    reason it was dropped unanswered)."""

    done: asyncio.Future[OutboundMessage | None]
    notices: list[str] = field(default_factory=list)
    dropped: str | None = None


@dataclass(frozen=True)
class _Answer:
    reply: OutboundMessage
    notices: tuple[str, ...]
    duplicate: bool = False  # given again: this request ran no turn of its own


class ApiAdapter:
    platform: ClassVar[str] = "api"
    # a reply is its request's response: stored as sent with its turn (a repeat with the
    # same Idempotency-Key reads it back), never overtaken by another reply of the chat
    replies_in_request: ClassVar[bool] = True

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
        models: tuple[str, ...] = (),
        subapps: dict[str, Callable[[], web.Application]] | None = None,
        stored_replies: StoredReplies | None = None,
        send_one: SendOne | None = None,
    ) -> None:
        # POST /v1/send (`switchboard send` through the daemon): one message to a chat
        self._send_one = send_one
        # where an idempotent repeat finds its first answer once memory has lost it
        self._stored_replies = stored_replies
        # prefix -> app factory (the dashboard's /ui and /api); they authenticate their own
        # callers (sign-in cookie or the key), so the bearer check here skips them
        self._subapps = dict(subapps or {})
        # extra endpoints other adapters serve here (Slack's Events API), keyed by path
        # (POST) or "METHOD path"; they authenticate their own callers (Slack signs), so
        # the bearer key does not apply
        self._routes = dict(routes or {})
        self._route_paths = {key.rpartition(" ")[2] for key in self._routes}
        self.host = host
        self.port = port
        self._key = key
        self._reply_timeout = reply_timeout_s
        self._health = health
        self._metrics = metrics
        self._models = models
        self._emit: Emit | None = None
        # keyed by (chat_id, message id): message ids are only unique within a chat
        self._pending: dict[tuple[str, str], _Exchange] = {}
        self._answered: OrderedDict[tuple[str, str], _Answer] = OrderedDict()
        # chat -> (request id, text) sent for its answered requests, for its next answer
        self._followups: OrderedDict[str, list[tuple[str, str]]] = OrderedDict()
        # (chat_id, message id) -> the callback_url that request gave
        self._callbacks: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._http: Any = None  # aiohttp.ClientSession for callbacks, made on first use
        self._runner: web.AppRunner | None = None
        self._started_at = int(time.time())
        self.state: str = AdapterState.STOPPED
        self.bound_port: int | None = None

    # --- lifecycle -------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._json_errors, self._auth])
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models_view)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/health", self._health_view)
        if self._send_one is not None:
            app.router.add_post("/v1/send", self._send_view)
        app.router.add_get("/metrics", self._metrics_view)
        for key, handler in self._routes.items():
            method, _, path = key.rpartition(" ")
            app.router.add_route(method or "POST", path, handler)
        for prefix, factory in self._subapps.items():
            app.add_subapp(prefix, factory())
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
        for ex in self._pending.values():
            if not ex.done.done():
                ex.done.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "port": self.bound_port,
            "waiting_requests": len(self._pending),
        }

    # --- Adapter interface -------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> SentRef:
        slot = (msg.chat_id, msg.reply_to or "")
        ex = self._pending.get(slot)
        if ex is not None and not ex.done.done():
            if msg.notice:
                ex.notices.append(msg.text)
            else:
                ex.done.set_result(msg)
        elif not msg.resend and (slot in self._answered or (
            ex is not None and not ex.done.cancelled() and ex.done.result() is not None
        )):  # fmt: skip
            await self._follow_up(slot, msg)  # the request was answered: this comes after
        return SentRef(self.platform, msg.chat_id, (msg.reply_to or "",))

    async def _follow_up(self, slot: tuple[str, str], msg: OutboundMessage) -> None:
        """A message for a request already answered: kept for the chat's next answer, and
        POSTed to the request's callback_url if it gave one (a failed POST is logged; the
        notice still comes)."""
        held = self._followups.setdefault(msg.chat_id, [])
        held.append((slot[1], msg.text))
        del held[:-FOLLOWUPS_PER_CHAT]
        self._followups.move_to_end(msg.chat_id)
        while len(self._followups) > ANSWERED_MEMORY:
            self._followups.popitem(last=False)
        callback = self._callbacks.get(slot)
        if callback is None:
            return
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=CALLBACK_TIMEOUT_S)
            )
        payload = {"type": "follow_up", "chat_id": msg.chat_id, "reply_to": msg.reply_to,
                   "text": msg.text, "session_id": msg.session_id}  # fmt: skip
        try:
            async with self._http.post(callback, json=payload) as resp:
                if resp.status >= 300:
                    log.warning("api callback %s answered %d; the follow-up to %s waits in "
                                "the chat's next answer", callback, resp.status, slot[1])  # fmt: skip
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("api callback %s failed (%s); the follow-up to %s waits in the "
                        "chat's next answer", callback, type(exc).__name__, slot[1])  # fmt: skip

    def _take_followups(self, chat_id: str, request: str) -> tuple[str, ...]:
        """The chat's follow-ups for its next answer: never the request's own (a result
        sent while its request was still being answered waits for the next one)."""
        held = self._followups.pop(chat_id, [])
        own = [(r, text) for r, text in held if r == request]
        if own:
            self._followups[chat_id] = own
        return tuple(text for r, text in held if r != request)

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        """The router is done with a message: a request still waiting was dropped (or, should
        a turn ever end without a reply, gets an error instead of hanging)."""
        ex = self._pending.get((msg.source.chat_id, msg.platform_message_id or ""))
        if ex is not None and not ex.done.done():
            ex.dropped = dropped or "no_reply"
            ex.done.set_result(None)

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        return None  # HTTP clients have no threads

    # --- HTTP ----------------------------------------------------------------------------

    @web.middleware
    async def _json_errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """aiohttp's own refusals (404, 405, 413 ...) are plain text: answer them as JSON too.
        Every 503 (this API's and each platform's webhook: "not taken, deliver again") says
        when to come back, `Retry-After`, unless its handler said it already."""
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            if exc.status == 413:
                return _error(413, f"the body is larger than {MAX_BODY} bytes", "body_too_large")
            response = _error(exc.status, exc.reason, None)
        if response.status == 503 and "Retry-After" not in response.headers and not response.prepared:
            response.headers["Retry-After"] = RETRY_AFTER_S
        return response

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if (
            self._key is not None
            and request.path != "/health"
            and request.path not in self._route_paths
            and not any(request.path.startswith(p + "/") for p in self._subapps)
        ):
            header = request.headers.get("Authorization", "")
            token = header[7:] if header.startswith("Bearer ") else ""
            if not hmac.compare_digest(token.encode(), self._key.encode()):
                return _error(401, "a valid bearer key is required", "invalid_api_key")
        return await handler(request)

    async def _send_view(self, request: web.Request) -> web.Response:
        """One message to a chat, for terminal commands on this machine only: the peer must
        be loopback (whatever the server listens on), and the bearer key applies as for the
        other endpoints. Body: {"platform", "target" (null: the home channel), "text"}."""
        import ipaddress

        from gateway.errors import ConfigError, GatewayError, NoHomeChannel
        from gateway.ops.send import BadTarget

        try:
            local = ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
        except ValueError:
            local = False
        # a reverse proxy on this machine connects from loopback too: what it forwards is not
        proxied = any(h in request.headers for h in ("Forwarded", "X-Forwarded-For", "X-Real-IP"))
        if not local or proxied:
            return _error(403, "POST /v1/send answers on loopback only", "loopback_only")
        body = await self._read_json(request)
        if isinstance(body, web.Response):
            return body
        platform, target, text = body.get("platform"), body.get("target"), body.get("text")
        if not isinstance(platform, str) or not platform:
            return _bad(400, "platform: required, a platform name")
        if target is not None and not isinstance(target, str):
            return _bad(400, "target: a chat id as a string, or null for the home channel")
        if not isinstance(text, str) or not text.strip():
            return _bad(400, "text: required, non-empty text")
        refused = _refused_text({"text": text, "target": target or ""})
        if refused is not None:
            return refused
        assert self._send_one is not None
        try:
            sent = await self._send_one(platform, target, text)
        except ConfigError as exc:
            return _error(404, str(exc), "not_configured")
        except NoHomeChannel as exc:
            return _error(409, str(exc), "no_home_channel")
        except BadTarget as exc:
            return _bad(400, str(exc))
        except GatewayError as exc:
            code = {69: "platform_unreachable", 77: "platform_refused"}.get(exc.exit_code)
            return _error(504 if code == "platform_unreachable" else 502, str(exc), code)
        queued = sent.get("state") != "sent"  # stored; the daemon tries again later
        return web.json_response({**sent, "sent": not queued}, status=202 if queued else 200)

    async def _health_view(self, request: web.Request) -> web.Response:
        body = self._health() if self._health else {"status": "ok"}
        return web.json_response(body, status=200 if body.get("status") == "ok" else 503)

    async def _metrics_view(self, request: web.Request) -> web.Response:
        text = self._metrics() if self._metrics else ""
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _models_view(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": self._started_at, "owned_by": "switchboard"}
            for m in self._models
        ]})  # fmt: skip

    @staticmethod
    def _idempotency_key(request: web.Request, fallback: str | None) -> str | None | web.Response:
        """The request's Idempotency-Key (else `fallback`, the body's or X-Request-Id's id);
        a 400 when it is malformed or disagrees with the body's message_id."""
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is None:
            return fallback
        if not key.strip() or len(key) > MAX_KEY or not key.isprintable():
            return _bad(400, f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_KEY} printable characters")
        return key

    async def _read_json(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            return _bad(400, "the body must be JSON")
        if not isinstance(body, dict):
            return _bad(400, "the body must be a JSON object")
        return body

    async def _stored_answer(
        self, source: SessionSource, message_id: str
    ) -> OutboundMessage | str | None:
        """The stored reply to an earlier request with this id (after a restart, or past the
        memory); "in_flight" when it is stored but not answered; None when never stored."""
        if self._stored_replies is None:
            return None
        stored = await self._stored_replies(source.chat_id, message_id)
        if stored is None:
            return None
        if stored.reply is None:
            return "in_flight"
        return OutboundMessage(
            self.platform, source.chat_id, stored.reply, reply_to=message_id,
            session_id=stored.session_id, session_key=stored.session_key,
        )  # fmt: skip

    async def _turn(
        self, source: SessionSource, text: str, message_id: str | None,
        callback: str | None = None,
    ) -> _Answer | web.Response:  # fmt: skip
        """Emit the message and wait for its answer. A message id already in flight waits for
        that first turn; one answered before gets the same answer again at once (from memory,
        else from the store) and runs no turn."""
        if self._emit is None or self.state != AdapterState.RUNNING:
            return _error(503, "the gateway is not accepting messages", "shutting_down")
        # a request without a message id gets one of 128 random bits (os.urandom: uuid4 builds a
        # UUID object in Python, about 2% of a replica's samples at 300 requests/s)
        slot = (source.chat_id, message_id or f"req-{os.urandom(16).hex()}")
        known = self._answered.get(slot)
        if known is not None:
            return _Answer(known.reply, known.notices, duplicate=True)
        ex = self._pending.get(slot)
        first = ex is None
        if ex is None:  # registered before the store is read: a repeat meanwhile waits on it
            ex = _Exchange(asyncio.get_running_loop().create_future())
            self._pending[slot] = ex
            if callback is not None:
                self._callbacks[slot] = callback
                while len(self._callbacks) > ANSWERED_MEMORY:
                    self._callbacks.popitem(last=False)
        replayed = False
        try:
            if first:
                try:
                    found = await self._stored_answer(source, message_id) if message_id else None
                except NotAccepted as exc:  # the store cannot be read: nothing is run or stored
                    log.warning("api message %s not accepted: %s", message_id, exc)
                    found = "not_accepted"
                except Exception:  # a fault of ours: said in full, and answered the same way
                    log.exception("api: the stored answer to %s could not be read", message_id)
                    found = "not_accepted"
                if ex.done.done():  # a recovered turn answered this key while the store was read
                    pass
                elif isinstance(found, OutboundMessage):
                    replayed = True
                    ex.done.set_result(found)
                elif found is not None:
                    ex.dropped = found
                    ex.done.set_result(None)
                else:
                    try:
                        await self._emit(
                            InboundMessage(source=source, text=text, platform_message_id=slot[1],
                                           received_at=time.time())
                        )  # fmt: skip
                    except NotAccepted as exc:
                        log.warning("api message %s not accepted: %s", slot[1], exc)
                        if not ex.done.done():
                            ex.dropped = (
                                "shutting_down" if exc.reason == "shutting_down" else "not_accepted"
                            )
                            ex.done.set_result(None)
            # shielded: a duplicate request that gives up must not cancel the first one's wait
            out = await asyncio.wait_for(asyncio.shield(ex.done), self._reply_timeout)
        except TimeoutError:
            return _error(504, "no reply in time; the message was stored", "timeout")
        except asyncio.CancelledError:
            if ex.done.cancelled():
                return _error(503, "the gateway is shutting down", "shutting_down")
            raise
        finally:
            if first:
                self._pending.pop(slot, None)
        if out is None and ex.dropped == "duplicate" and first and message_id is not None:
            # stored meanwhile by another request path: its first answer, if there is one yet
            try:
                found = await self._stored_answer(source, message_id)
            except NotAccepted:  # unreadable now: the caller asks again
                found = "in_flight"
            if isinstance(found, OutboundMessage):
                out, replayed = found, True
            elif found is not None:
                ex.dropped = found
        elif out is None and ex.dropped == "answered_elsewhere" and first:
            # another replica ran this request's turn (it held the chat's lease): its reply
            # is stored; this is the first answer the caller gets, not a replay
            try:
                found = await self._stored_answer(source, slot[1])
            except NotAccepted:  # unreadable now: the caller asks again
                found = "in_flight"
            if isinstance(found, OutboundMessage):
                out = found
            elif found is not None:  # stored, not answered yet (its runner died, say): ask again
                ex.dropped = found
        if out is None:
            status, code, message = _DROPPED.get(
                ex.dropped or "", (500, "no_reply", "the message was not answered")
            )
            return _error(status, message, code)
        fresh = first and not replayed and out.error is None  # an error's notices may be lost
        held = self._take_followups(source.chat_id, slot[1]) if fresh else ()
        answer = _Answer(out, (*held, *ex.notices), duplicate=replayed or not first)
        if first and out.error not in ("storage", "unstorable"):  # not stored: a retry runs again
            self._answered[slot] = answer
            while len(self._answered) > ANSWERED_MEMORY:
                self._answered.popitem(last=False)
        return answer

    @staticmethod
    def _callback_url(body: dict[str, Any]) -> str | None | web.Response:
        """The body's `callback_url`: where follow-ups to this request are POSTed."""
        url = body.get("callback_url")
        if url is None:
            return None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            return _bad(400, "callback_url must be an http:// or https:// URL")
        return url

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_json(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _bad(400, "messages must be a non-empty list")
        last = messages[-1]
        if not isinstance(last, dict) or last.get("role") != "user":
            return _bad(400, "the last message must have role 'user'")
        at = f"messages[{len(messages) - 1}].content"
        content = last.get("content")
        fields: dict[str, str] = {}
        if isinstance(content, list):  # content parts: keep the text ones
            fields = {f"{at}[{k}].text": p["text"] for k, p in enumerate(content)
                      if isinstance(p, dict) and p.get("type") == "text"
                      and isinstance(p.get("text"), str)}  # fmt: skip
            content = "\n".join(fields.values())
        elif isinstance(content, str):
            fields = {at: content}
        if not isinstance(content, str) or not content.strip():
            return _bad(400, "the last user message has no text")
        refused = _refused_text(fields)
        if refused is not None:
            return refused
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            return _bad(400, "stream must be true or false")
        who = request.headers.get("X-Switchboard-Session") or body.get("user") or "default"
        if not isinstance(who, str) or not who.strip() or len(who) > 200:
            return _bad(
                400,
                "user / X-Switchboard-Session must be a non-empty string of at most 200 characters",
            )
        refused = _refused_text({"user": who})
        if refused is not None:
            return refused
        model = body.get("model") if isinstance(body.get("model"), str) else None
        model = model or (self._models[0] if self._models else "switchboard")
        source = SessionSource(
            platform="api", chat_id=who, chat_type=ChatType.DM, user_id=who, user_name=who
        )
        key = self._idempotency_key(request, request.headers.get("X-Request-Id"))
        if isinstance(key, web.Response):
            return key
        callback = self._callback_url(body)
        if isinstance(callback, web.Response):
            return callback
        answer = await self._turn(source, content, key, callback)
        if isinstance(answer, web.Response):
            return answer
        out = answer.reply
        if out.error == "storage":  # not stored: never answer 200 for it
            return _error(503, out.text, "storage_unavailable")
        if out.error == "unstorable":  # not stored, and it never can be
            return _error(400, out.text, "unstorable_input")
        if out.error == "agent":  # the chat platforms get an apology; an API client an error
            return _error(502, "the agent failed to answer; the message was stored",
                          "agent_error")  # fmt: skip
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        usage, counted_by = _usage(out)
        extra = {"session_id": out.session_id, "session_key": out.session_key,
                 "notices": list(answer.notices), "duplicate": answer.duplicate,
                 "usage_source": counted_by}  # fmt: skip
        replayed = {REPLAYED_HEADER: "true"} if answer.duplicate else {}
        if stream:
            options = body.get("stream_options")
            with_usage = isinstance(options, dict) and options.get("include_usage") is True
            return await self._stream(request, ident, created, model, out.text, extra, replayed,
                                      usage if with_usage else None)  # fmt: skip
        return web.json_response(headers=replayed, data={
            "id": ident,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text}, "finish_reason": "stop"}],
            "usage": usage,
            "switchboard": extra,
        })  # fmt: skip

    async def _stream(
        self, request: web.Request, ident: str, created: int, model: str, text: str,
        extra: dict[str, Any], headers: dict[str, str], usage: dict[str, int] | None = None,
    ) -> web.StreamResponse:  # fmt: skip
        """The finished reply as OpenAI chat.completion.chunk events: the role, the content
        (in pieces of a few hundred characters), the stop, with `usage` (asked for with
        `stream_options.include_usage`) a chunk without choices carrying it, then [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", **headers})  # fmt: skip
        await resp.prepare(request)

        async def event(delta: dict[str, str], finish: str | None, **more: Any) -> None:
            chunk = {"id": ident, "object": "chat.completion.chunk", "created": created,
                     "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                     **more}  # fmt: skip
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await event({"role": "assistant", "content": ""}, None)
        for i in range(0, len(text), 400):
            await event({"content": text[i : i + 400]}, None)
        await event({}, "stop", switchboard=extra)
        if usage is not None:
            chunk = {"id": ident, "object": "chat.completion.chunk", "created": created,
                     "model": model, "choices": [], "usage": usage}  # fmt: skip
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _messages(self, request: web.Request) -> web.Response:
        body = await self._read_json(request)
        if isinstance(body, web.Response):
            return body
        text = body.get("text")
        chat_id = body.get("chat_id")
        if not isinstance(text, str) or not text.strip():
            return _bad(400, "text must be a non-empty string")
        if chat_id is None:
            return _bad(400, "chat_id is required")
        if not isinstance(chat_id, (str, int)) or isinstance(chat_id, bool):
            return _bad(400, f"chat_id must be a string or an integer, not {_json_type(chat_id)}")
        if not str(chat_id).strip():
            return _bad(400, "chat_id must not be empty")
        chat_type = body.get("chat_type", ChatType.DM)
        if chat_type not in CHAT_TYPES:
            return _bad(400, f"chat_type must be one of {', '.join(CHAT_TYPES)}")
        opt = {}
        for name in ("user_id", "user_name", "chat_name", "thread_id", "message_id"):
            v = body.get(name)
            if v is not None and (not isinstance(v, (str, int)) or isinstance(v, bool)):
                return _bad(400, f"{name} must be a string, not {_json_type(v)}")
            opt[name] = None if v is None else str(v)
        strings = {"text": text, "chat_id": str(chat_id)} | {k: v for k, v in opt.items() if v}
        refused = _refused_text(strings)
        if refused is not None:
            return refused
        source = SessionSource(
            platform="api", chat_id=str(chat_id), chat_type=chat_type,
            user_id=opt["user_id"] or (str(chat_id) if chat_type == ChatType.DM else None),
            user_name=opt["user_name"], chat_name=opt["chat_name"], thread_id=opt["thread_id"],
        )  # fmt: skip
        key = self._idempotency_key(request, opt["message_id"])
        if isinstance(key, web.Response):
            return key
        if opt["message_id"] is not None and key != opt["message_id"]:
            return _bad(400, f"message_id and the {IDEMPOTENCY_HEADER} header differ")
        callback = self._callback_url(body)
        if isinstance(callback, web.Response):
            return callback
        answer = await self._turn(source, text, key, callback)
        if isinstance(answer, web.Response):
            return answer
        out = answer.reply
        if out.error == "storage":  # not stored: never answer 200 for it
            return _error(503, out.text, "storage_unavailable")
        if out.error == "unstorable":  # not stored, and it never can be
            return _error(400, out.text, "unstorable_input")
        replayed = {REPLAYED_HEADER: "true"} if answer.duplicate else {}
        return web.json_response(headers=replayed, data={
            "reply": out.text, "notices": list(answer.notices), "session_id": out.session_id,
            "session_key": out.session_key, "error": out.error, "duplicate": answer.duplicate,
        })  # fmt: skip
