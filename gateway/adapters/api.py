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

This module owns the server, its middlewares and a request's turn (`ApiAdapter.turn`); the
endpoints read and answer their own shapes in api_openai.py, api_messages.py and
api_send.py, over the errors and checks of api_wire.py.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp
from aiohttp import web

from gateway.adapters.api_messages import messages
from gateway.adapters.api_openai import chat_completions, models_list
from gateway.adapters.api_send import SendOne, send_view
from gateway.adapters.api_wire import DROPPED, MAX_BODY, RETRY_AFTER_S, Answer, error
from gateway.adapters.base import Emit, Listens, TurnHooks
from gateway.errors import NotAccepted
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState

if TYPE_CHECKING:
    from state import StoredReply

log = logging.getLogger("gateway.adapters.api")
ANSWERED_MEMORY = 10_000  # recent answers kept to reply to a redelivered message_id at once
FOLLOWUPS_PER_CHAT = 20  # follow-ups (background results) a chat's next answer carries at most
CALLBACK_TIMEOUT_S = 10.0
# (chat_id, key) -> the stored user message and its reply, read from the store
StoredReplies = Callable[[str, str], Awaitable["StoredReply | None"]]


@dataclass
class _Exchange:
    """One request's answer as the router sends it: notices first, then the reply (or the
    reason it was dropped unanswered)."""

    done: asyncio.Future[OutboundMessage | None]
    notices: list[str] = field(default_factory=list)
    dropped: str | None = None


class ApiAdapter(TurnHooks, Listens):
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
        self._answered: OrderedDict[tuple[str, str], Answer] = OrderedDict()
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
        app.router.add_post(
            "/v1/chat/completions", partial(chat_completions, self.turn, self._models)
        )
        app.router.add_get("/v1/models", partial(models_list, self._models, self._started_at))
        app.router.add_post("/v1/messages", partial(messages, self.turn))
        app.router.add_get("/health", self._health_view)
        if self._send_one is not None:
            app.router.add_post("/v1/send", partial(send_view, self._send_one))
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
        elif not msg.resend and (
            slot in self._answered
            or (ex is not None and not ex.done.cancelled() and ex.done.result() is not None)
        ):
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
        payload = {
            "type": "follow_up",
            "chat_id": msg.chat_id,
            "reply_to": msg.reply_to,
            "text": msg.text,
            "session_id": msg.session_id,
        }
        try:
            async with self._http.post(callback, json=payload) as resp:
                if resp.status >= 300:
                    log.warning(
                        "api callback %s answered %d; the follow-up to %s waits in "
                        "the chat's next answer",
                        callback,
                        resp.status,
                        slot[1],
                    )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning(
                "api callback %s failed (%s); the follow-up to %s waits in the chat's next answer",
                callback,
                type(exc).__name__,
                slot[1],
            )

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
                return error(413, f"the body is larger than {MAX_BODY} bytes", "body_too_large")
            response = error(exc.status, exc.reason, None)
        if (
            response.status == 503
            and "Retry-After" not in response.headers
            and not response.prepared
        ):
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
                return error(401, "a valid bearer key is required", "invalid_api_key")
        return await handler(request)

    async def _health_view(self, request: web.Request) -> web.Response:
        body = self._health() if self._health else {"status": "ok"}
        return web.json_response(body, status=200 if body.get("status") == "ok" else 503)

    async def _metrics_view(self, request: web.Request) -> web.Response:
        text = self._metrics() if self._metrics else ""
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

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
            self.platform,
            source.chat_id,
            stored.reply,
            reply_to=message_id,
            session_id=stored.session_id,
            session_key=stored.session_key,
        )

    async def turn(
        self,
        source: SessionSource,
        text: str,
        message_id: str | None,
        callback: str | None = None,
    ) -> Answer | web.Response:
        """Emit the message and wait for its answer. A message id already in flight waits for
        that first turn; one answered before gets the same answer again at once (from memory,
        else from the store) and runs no turn."""
        if self._emit is None or self.state != AdapterState.RUNNING:
            return error(503, "the gateway is not accepting messages", "shutting_down")
        # a request without a message id gets one of 128 random bits (os.urandom: uuid4 builds a
        # UUID object in Python, about 2% of a replica's samples at 300 requests/s)
        slot = (source.chat_id, message_id or f"req-{os.urandom(16).hex()}")
        known = self._answered.get(slot)
        if known is not None:
            return Answer(known.reply, known.notices, duplicate=True)
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
                            InboundMessage(
                                source=source,
                                text=text,
                                platform_message_id=slot[1],
                                received_at=time.time(),
                            )
                        )
                    except NotAccepted as exc:
                        log.warning("api message %s not accepted: %s", slot[1], exc)
                        if not ex.done.done():
                            ex.dropped = (
                                "shutting_down" if exc.reason == "shutting_down" else "not_accepted"
                            )
                            ex.done.set_result(None)
            # shielded: a duplicate request that gives up must not cancel the first one's wait
            async with asyncio.timeout(self._reply_timeout):
                out = await asyncio.shield(ex.done)
        except TimeoutError:
            return error(504, "no reply in time; the message was stored", "timeout")
        except asyncio.CancelledError:
            if ex.done.cancelled():
                return error(503, "the gateway is shutting down", "shutting_down")
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
            status, code, message = DROPPED.get(
                ex.dropped or "", (500, "no_reply", "the message was not answered")
            )
            return error(status, message, code)
        fresh = first and not replayed and out.error is None  # an error's notices may be lost
        held = self._take_followups(source.chat_id, slot[1]) if fresh else ()
        answer = Answer(out, (*held, *ex.notices), duplicate=replayed or not first)
        if first and out.error not in ("storage", "unstorable"):  # not stored: a retry runs again
            self._answered[slot] = answer
            while len(self._answered) > ANSWERED_MEMORY:
                self._answered.popitem(last=False)
        return answer
