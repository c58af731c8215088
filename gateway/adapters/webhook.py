"""A generic signed webhook for anything else: `POST /webhooks/<name>` on the daemon's HTTP
server for each configured endpoint, every request signed (webhook_wire.py) and checked
before anything else. Each endpoint answers in the response body (sync: the request waits
for the turn, up to its timeout) or by a signed POST to its `callback_url` (async: 202 as
soon as the message is committed). Chats live in their own key space, `<name>:<chat or user>`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Emit,
    HomeIds,
    Outbound,
    Route,
    SetupSteps,
    TurnHooks,
    call_with_retry,
    send_by_trace,
)
from gateway.adapters.kit.webhook import WebhookReplies, api_server_off, committed, taking
from gateway.adapters.webhook_wire import (
    HEADER,
    endpoints_problem,
    sign,
    split_chat,
    to_inbound,
    verify,
)
from gateway.errors import AdapterError, ConfigError, PlatformRefused, RetryAfter, TransientError
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, in_range, setting
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.webhook")
REPLIES = WebhookReplies(
    "error", "the gateway is not accepting messages", deliver_again="not stored; send it again"
)
PATH = "/webhooks/{}"
ANSWERED_MEMORY = 10_000  # recent answers, to answer a replayed id without a second turn
_DROPPED = {
    "unauthorised": (403, "this user may not use the gateway"),
    "shutting_down": (503, "the gateway is shutting down; send it again"),
    "unstorable": (
        400,
        "the message holds a value the store can never keep; nothing "
        "was stored, and sending it again cannot help",
    ),
}


@dataclass(frozen=True)
class WebhookSettings(PlatformSettings):
    endpoints: dict[str, Any] = setting(
        {}, endpoints_problem, "name -> {secret_env, mode, callback_url, reply_timeout_seconds}"
    )
    tolerance_seconds: int = setting(
        300, in_range(30, 3_600), "signed timestamps older are refused"
    )


@dataclass(frozen=True)
class Endpoint:
    name: str
    secret: str
    mode: str = "sync"
    callback_url: str | None = None
    reply_timeout_s: float = 25.0


@dataclass
class _Exchange:
    done: asyncio.Future[OutboundMessage | None]
    notices: list[str] = field(default_factory=list)
    dropped: str | None = None
    late: bool = False  # the request gave up waiting: the reply goes to the callback


class WebhookAdapter(TurnHooks, HomeIds, Outbound, SetupSteps):
    platform: ClassVar[str] = "webhook"
    settings: ClassVar[type[WebhookSettings]] = WebhookSettings
    library_loggers: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def secrets_needed(cls, settings: WebhookSettings) -> list[SecretNeed]:
        """One signing secret per endpoint, named by its `secret_env` (nested keys)."""
        return [
            SecretNeed(
                f"endpoints.{name}.secret_env",
                str(spec["secret_env"]),
                f"the signing secret of endpoint {name}",
            )
            for name, spec in settings.endpoints.items()
            if isinstance(spec, Mapping) and isinstance(spec.get("secret_env"), str)
        ]

    @classmethod
    def problems(cls, settings: WebhookSettings, api_enabled: bool) -> list[ConfigError]:
        out = api_server_off(cls.platform, api_enabled, served="the endpoints are")
        if not settings.endpoints:
            out.append(ConfigError("platforms.webhook.endpoints", "needs at least one endpoint"))
        for key in ("token_env", "base_url"):
            if getattr(settings, key) is not None:
                out.append(
                    ConfigError(
                        f"platforms.webhook.{key}",
                        "is not used by the webhook (each endpoint has secret_env)",
                    )
                )
        return out

    @classmethod
    def endpoints_of(cls, settings: WebhookSettings, secrets: Mapping[str, str]) -> list[Endpoint]:
        return [
            Endpoint(
                name,
                secrets.get(f"endpoints.{name}.secret_env", ""),
                spec.get("mode", "sync"),
                spec.get("callback_url"),
                float(spec.get("reply_timeout_seconds", 25)),
            )
            for name, spec in settings.endpoints.items()
        ]

    @classmethod
    def from_config(cls, settings: WebhookSettings, secrets: Mapping[str, str]) -> WebhookAdapter:
        return cls(cls.endpoints_of(settings, secrets), tolerance_s=settings.tolerance_seconds)

    @classmethod
    def setup_steps(cls, settings: WebhookSettings) -> list[str]:
        """What to do on webhook's side (`switchboard setup` prints it)."""
        return [
            "give each caller its endpoint's secret: requests are signed with HMAC-SHA256 "
            "over the body (docs: platforms/webhook)",
            "an endpoint in async mode needs a callback_url that takes the replies",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {PATH.format(name): partial(self.handle, name) for name in self._endpoints}

    @classmethod
    async def check_credentials(
        cls, settings: WebhookSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        """Each endpoint's mode and, where it has a callback, whether the callback answers a
        signed `{"type": "ping"}` with a 2xx."""
        adapter = cls.from_config(settings, secrets)
        lines, ok = [], True
        try:
            for ep in adapter._endpoints.values():
                line = f"{ep.name}: {ep.mode}"
                if ep.callback_url:
                    try:
                        await adapter._post(ep, {"type": "ping", "endpoint": ep.name})
                        line += f", callback {ep.callback_url} answers"
                    except AdapterError as exc:
                        ok, line = False, f"{line}, callback {ep.callback_url}: {exc}"
                else:
                    line += ", no callback"
                lines.append(line)
        finally:
            await adapter.stop()
        return ok, "; ".join(lines) or "no endpoints"

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """A configured home `<name>:<user>` continues in that user's own conversation."""
        return "dm"

    @classmethod
    def split_home(cls, value: str) -> tuple[str, str | None]:
        """The id holds a colon itself (`ci:ops`): the whole value is the chat."""
        return value, None

    @classmethod
    def thread_source(cls, thread: ThreadRef) -> SessionSource:
        return SessionSource(
            cls.platform, thread.chat_id, ChatType.THREAD, thread_id=thread.thread_id
        )

    def __init__(
        self,
        endpoints: list[Endpoint],
        *,
        tolerance_s: float = 300.0,
        timeout_s: float = 30.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        clock: Any = time.time,
    ) -> None:
        self._endpoints = {ep.name: ep for ep in endpoints}
        self._tolerance = tolerance_s
        self._timeout = timeout_s
        self._backoff = backoff
        self._clock = clock
        self._http: Any = None  # aiohttp.ClientSession for callbacks, made on first use
        self._emit: Emit | None = None
        self._pending: dict[tuple[str, str], _Exchange] = {}
        self._answered: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None
        self.refused = 0  # requests refused for their signature

    # --- lifecycle ------------------------------------------------------------------

    async def open_outbound(self) -> None:
        """Ready to send (`switchboard send` without a daemon): an endpoint's sends are
        posts to its callback_url, which need nothing opened first."""

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        self.state = AdapterState.RUNNING
        log.info("webhook endpoints: %s", ", ".join(PATH.format(n) for n in self._endpoints))

    async def stop(self) -> None:
        self.state = AdapterState.STOPPED
        for ex in self._pending.values():
            if not ex.done.done():
                ex.done.cancel()
        if self._http is not None:
            await self._http.close()
            self._http = None

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "endpoints": sorted(self._endpoints),
            "waiting_requests": len(self._pending),
            "refused": self.refused,
            "last_error": self.last_error,
        }

    # --- inbound --------------------------------------------------------------------

    async def handle(self, name: str, request: Any) -> Any:
        """POST /webhooks/<name>: the signature first, then the body, then the turn."""
        from aiohttp import web

        ep = self._endpoints[name]
        body = await request.read()
        refusal = verify(
            ep.secret, request.headers.get(HEADER), body, self._clock(), self._tolerance
        )
        if refusal is not None:
            self.refused += 1
            log.warning("refused a POST to %s: %s", PATH.format(name), refusal.reason)
            return web.json_response({"error": refusal.reason}, status=refusal.status)
        if taking(self._emit, self.state) is None:
            return REPLIES.stopped()
        try:
            msg = to_inbound(name, json.loads(body), self._clock())
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            bad_json = isinstance(exc, json.JSONDecodeError | UnicodeDecodeError)
            text = "the body must be JSON" if bad_json else str(exc)
            return web.json_response({"error": text}, status=400)
        slot = (msg.source.chat_id, str(msg.platform_message_id))
        if (known := self._answered.get(slot)) is not None:
            status = 200 if "reply" in known else 202  # a sync answer, or an async acceptance
            return web.json_response({**known, "duplicate": True}, status=status)
        if ep.mode == "async":
            return await self._accept(msg, slot)
        return await self._wait(ep, msg, slot)

    async def _accept(self, msg: InboundMessage, slot: tuple[str, str]) -> Any:
        from aiohttp import web

        assert self._emit is not None
        if not await committed(self._emit, [msg]):
            return REPLIES.again()
        answer = {"id": slot[1], "status": "accepted"}
        self._remember(slot, answer)
        return web.json_response({**answer, "duplicate": False}, status=202)

    async def _wait(self, ep: Endpoint, msg: InboundMessage, slot: tuple[str, str]) -> Any:
        from aiohttp import web

        assert self._emit is not None
        ex = self._pending.get(slot)
        first = ex is None
        if ex is None:
            ex = _Exchange(asyncio.get_running_loop().create_future())
            self._pending[slot] = ex
            if not await committed(self._emit, [msg]):
                self._pending.pop(slot, None)
                return REPLIES.again()
        try:  # shielded: a replay that gives up must not cancel the first request's wait
            out = await asyncio.wait_for(asyncio.shield(ex.done), ep.reply_timeout_s)
        except TimeoutError:
            ex.late = True
            where = "POSTed to the callback_url" if ep.callback_url else "kept in the session only"
            return web.json_response(
                {
                    "id": slot[1],
                    "status": "accepted",
                    "reply": None,
                    "detail": f"no reply within {ep.reply_timeout_s:g} s; it will be {where}",
                },
                status=202,
            )
        except asyncio.CancelledError:
            if ex.done.cancelled():
                return web.json_response({"error": "the gateway is shutting down"}, status=503)
            raise
        finally:
            if first and not ex.late:
                self._pending.pop(slot, None)
        if out is None:
            if ex.dropped == "duplicate":
                return web.json_response({"id": slot[1], "reply": None, "duplicate": True})
            status, text = _DROPPED.get(ex.dropped or "", (500, "the message was not answered"))
            return web.json_response({"error": text}, status=status)
        if out.error == "storage":  # not stored: a retry must run again
            return web.json_response({"error": out.text}, status=503)
        if out.error == "unstorable":  # not stored, and it never can be
            return web.json_response({"error": out.text}, status=400)
        answer = {
            "id": slot[1],
            "reply": out.text,
            "notices": list(ex.notices),
            "session_id": out.session_id,
            "error": out.error,
        }
        if first:
            self._remember(slot, answer)
        return web.json_response({**answer, "duplicate": not first})

    def _remember(self, slot: tuple[str, str], answer: dict[str, Any]) -> None:
        self._answered[slot] = answer
        while len(self._answered) > ANSWERED_MEMORY:
            self._answered.popitem(last=False)

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        ex = self._pending.get((msg.source.chat_id, msg.platform_message_id or ""))
        if ex is not None and not ex.done.done():
            ex.dropped = dropped or "no_reply"
            ex.done.set_result(None)
        if ex is not None and ex.late:
            self._pending.pop((msg.source.chat_id, msg.platform_message_id or ""), None)

    # --- outbound -------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> SentRef:
        """A waiting request gets the reply in its response; anything else (async mode, a
        request that timed out, a handoff) is POSTed to the endpoint's callback_url."""
        slot = (msg.chat_id, msg.reply_to or "")
        ex = self._pending.get(slot)
        if ex is not None and not ex.done.done():
            if msg.notice:
                ex.notices.append(msg.text)
            else:
                ex.done.set_result(msg)
            if not ex.late:
                return SentRef(self.platform, msg.chat_id, (msg.reply_to or "",))
            if not msg.notice and msg.error != "storage":  # a replay now gets it at once
                self._remember(
                    slot,
                    {
                        "id": slot[1],
                        "reply": msg.text,
                        "notices": ex.notices,
                        "session_id": msg.session_id,
                        "error": msg.error,
                    },
                )
        name, chat = split_chat(msg.chat_id)
        ep = self._endpoints.get(name)
        if ep is None or not ep.callback_url:
            log.warning(
                "reply for %s kept in the session only: endpoint %r has no callback_url",
                msg.chat_id,
                name,
            )
            return SentRef(self.platform, msg.chat_id, ())
        delivery = f"dlv-{uuid.uuid4().hex}"
        payload = {
            "type": "notice" if msg.notice else "reply",
            "delivery_id": delivery,
            "endpoint": name,
            "chat_id": msg.chat_id,
            "chat": chat,
            "thread": msg.thread_id,
            "reply_to": msg.reply_to,
            "text": msg.text,
            "session_id": msg.session_id,
            "error": msg.error,
        }
        try:
            await call_with_retry(lambda: self._post(ep, payload), backoff=self._backoff, log=log)
        except AdapterError as exc:
            self.last_error = str(exc)
            raise
        return SentRef(self.platform, msg.chat_id, (delivery,))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """A webhook has no threads to open: a handoff goes to the home chat's callback."""
        return None

    async def _post(self, ep: Endpoint, payload: dict[str, Any]) -> None:
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                trace_configs=[send_by_trace()],  # a reply that set out late stops here
            )
        body = json.dumps(payload, ensure_ascii=False).encode()
        headers = {
            "Content-Type": "application/json",
            HEADER: sign(ep.secret, int(self._clock()), body),
        }
        try:
            async with self._http.post(str(ep.callback_url), data=body, headers=headers) as resp:
                if resp.status == 429:
                    try:
                        raise RetryAfter(float(resp.headers.get("Retry-After") or 1.0))
                    except ValueError:
                        raise RetryAfter(1.0) from None
                if resp.status >= 500:
                    raise TransientError(f"the callback answered {resp.status}")
                if resp.status >= 300:
                    raise PlatformRefused(f"the callback refused the POST ({resp.status})")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransientError(f"the callback is unreachable ({type(exc).__name__})") from exc
