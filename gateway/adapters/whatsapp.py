"""WhatsApp Business Cloud API: webhooks in (served on the daemon's HTTP server), Graph API
calls out (aiohttp); the wire format's pure functions live in whatsapp_wire.py.

Every POST is checked against `X-Hub-Signature-256` (HMAC-SHA256 of the raw body with the
app secret) before anything else is read. Meta signs no timestamp, so a replayed delivery
is caught by the core's dedupe on the message id (`wamid...`) and by the age check on the
message's own timestamp. The chat is always 1:1, one session per phone number.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Emit,
    Outbound,
    Route,
    SetupSteps,
    Typing,
    call_with_retry,
    send_by_trace,
)
from gateway.adapters.kit.chats import AsksWhoami, DirectOnly
from gateway.adapters.kit.lifecycle import start_whoami
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.webhook import WebhookReplies, api_server_off, committed, taking
from gateway.adapters.whatsapp_wire import (
    WINDOW_CLOSED,
    WindowClosed,
    graph_error,
    messages_of,
    signature_ok,
    statuses_of,
    to_inbound,
    to_whatsapp,
)
from gateway.errors import AdapterError, ConfigError, InvalidToken, TransientError
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, in_range, setting
from gateway.vocab import AdapterState

log = logging.getLogger("gateway.adapters.whatsapp")
REPLIES = WebhookReplies()  # text/plain refusals
WEBHOOK_PATH = "/whatsapp/webhook"
GRAPH = "https://graph.facebook.com"
LIMIT = 4_096


def _version(v: Any) -> str | None:
    return None if re.fullmatch(r"v\d+\.\d+", str(v)) else f"must look like v23.0 (got {v!r})"


@dataclass(frozen=True)
class WhatsAppSettings(PlatformSettings):
    phone_number_id: str | int | None = setting(
        None, doc="the business number's id in Meta's console"
    )
    api_version: str = setting("v23.0", _version, "the Graph API version")
    app_secret_env: str | None = setting(None, env_name, "env var holding the Meta app secret")
    verify_token_env: str | None = setting(None, env_name, "env var holding the verify token")
    max_age_seconds: int = setting(86_400, in_range(60, 7 * 86_400), "older messages are dropped")


# --- the adapter ------------------------------------------------------------------------


class WhatsAppAdapter(DirectOnly, AsksWhoami, Typing, Outbound, SetupSteps):
    """Cloud API chats are 1:1 with a phone number, and have no threads: a handoff lands in
    the home number's own chat."""

    platform: ClassVar[str] = "whatsapp"
    settings: ClassVar[type[WhatsAppSettings]] = WhatsAppSettings
    drain_per_second: ClassVar[float] = (
        50.0  # the outbox's backlog pace (the WhatsApp Cloud API: 80 a second)
    )
    library_loggers: ClassVar[tuple[str, ...]] = ()
    # a free-form reply may go within 24 hours of the user's last message (the
    # customer-service window); later the Cloud API refuses it
    reply_window_s: ClassVar[float] = 24 * 3600.0

    @classmethod
    def secrets_needed(cls, settings: WhatsAppSettings) -> list[SecretNeed]:
        return [
            SecretNeed("token_env", "WHATSAPP_TOKEN", "the Cloud API access token"),
            SecretNeed("app_secret_env", "WHATSAPP_APP_SECRET", "webhook signatures"),
            SecretNeed("verify_token_env", "WHATSAPP_VERIFY_TOKEN", "the webhook handshake"),
        ]

    @classmethod
    def problems(cls, settings: WhatsAppSettings, api_enabled: bool) -> list[ConfigError]:
        out = api_server_off(cls.platform, api_enabled)
        if not settings.phone_number_id:
            out.append(
                ConfigError(
                    "platforms.whatsapp.phone_number_id",
                    "is required (Meta's console: WhatsApp > API Setup)",
                )
            )
        return out

    @classmethod
    def from_config(cls, settings: WhatsAppSettings, secrets: Mapping[str, str]) -> WhatsAppAdapter:
        return cls(
            str(settings.phone_number_id),
            secrets.get("token_env", ""),
            secrets.get("app_secret_env", ""),
            secrets.get("verify_token_env", ""),
            api_version=settings.api_version,
            base_url=settings.base_url,
            max_age_s=settings.max_age_seconds,
        )

    @classmethod
    def setup_steps(cls, settings: WhatsAppSettings) -> list[str]:
        """What to do on whatsapp's side (`switchboard setup` prints it)."""
        return [
            "developers.facebook.com: a Business app with the WhatsApp product; note the "
            "phone number ID; a system user's permanent token (WHATSAPP_TOKEN); the app "
            "secret (WHATSAPP_APP_SECRET)",
            "WhatsApp > Configuration: the callback URL below with your verify token "
            "(WHATSAPP_VERIFY_TOKEN), subscribed to the messages field; the daemon must run "
            "when you save (Meta checks the URL)",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {WEBHOOK_PATH: self.handle_webhook, f"GET {WEBHOOK_PATH}": self.handle_handshake}

    def __init__(
        self,
        phone_number_id: str,
        token: str,
        app_secret: str,
        verify_token: str,
        *,
        api_version: str = "v23.0",
        base_url: str | None = None,
        max_age_s: float = 86_400,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self._number = phone_number_id
        self._token = token
        self._secret = app_secret
        self._verify = verify_token
        self._base = f"{(base_url or GRAPH).rstrip('/')}/{api_version}"
        self._max_age = max_age_s
        self._backoff = backoff
        self._http: Any = None  # aiohttp.ClientSession, made on first use
        self._emit: Emit | None = None
        self._typing: dict[str, asyncio.Task[None]] = {}
        self.number_name: str | None = None
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None
        self.window_closed = 0  # replies refused: over 24 h since the user wrote
        self.stale_dropped = 0

    # --- lifecycle ------------------------------------------------------------------

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        self.number_name = await start_whoami(
            self,
            self._whoami,
            by="whatsapp",
            credential="access token",
            refused_as="invalid token",
            unreachable="could not look up the business number",
            log=log,
        )
        log.info("whatsapp webhook at %s for %s", WEBHOOK_PATH, self.number_name or self._number)

    async def stop(self) -> None:
        for task in self._typing.values():
            task.cancel()
        self._typing.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "number": self.number_name,
            "last_error": self.last_error,
            "window_closed": self.window_closed,
            "stale_dropped": self.stale_dropped,
        }

    # --- webhooks ---------------------------------------------------------------------

    async def handle_handshake(self, request: Any) -> Any:
        """GET: Meta's subscription check; the challenge is echoed for our verify token."""
        from aiohttp import web

        q = request.query
        token = q.get("hub.verify_token", "")
        if (
            q.get("hub.mode") == "subscribe"
            and self._verify
            and hmac.compare_digest(token.encode(), self._verify.encode())
        ):
            return web.Response(text=q.get("hub.challenge", ""))
        return web.Response(status=403, text="forbidden")

    async def handle_webhook(self, request: Any) -> Any:
        """POST: the signature first; then each message is handed to the core, and the
        delivery is acknowledged only once every one was accepted (503 lets Meta retry)."""
        from aiohttp import web

        body = await request.read()
        header = request.headers.get("X-Hub-Signature-256")
        if not signature_ok(self._secret, body, header):
            log.warning(
                "refused a webhook POST with a %s signature", "bad" if header else "missing"
            )
            return web.Response(status=401 if not header else 403, text="bad signature")
        if (emit := taking(self._emit, self.state)) is None:
            return REPLIES.stopped()
        try:
            payload = json.loads(body)
        except ValueError:
            return web.Response(status=400, text="not JSON")
        for status in statuses_of(payload):
            self._note_status(status)
        now = time.time()
        fresh = (self._fresh(to_inbound(m, names), now) for m, names in messages_of(payload))
        if not await committed(emit, fresh):
            return REPLIES.again()
        return web.Response(text="ok")

    def _fresh(self, msg: InboundMessage | None, now: float) -> InboundMessage | None:
        """`msg` unless it is older than max_age_seconds (then dropped and counted)."""
        if msg is None:
            return None
        age = now - msg.received_at
        if age > self._max_age:
            self.stale_dropped += 1
            log.info(
                "dropped stale message %s (%.0fs old, limit %.0fs)",
                msg.platform_message_id,
                age,
                self._max_age,
            )
            return None
        return msg

    def _note_status(self, status: Mapping[str, Any]) -> None:
        """Statuses never start a turn; a failed delivery is worth a log line, and Meta
        often reports a closed 24-hour window this way rather than on the send call."""
        if status.get("status") != "failed":
            return
        errors = status.get("errors") or [{}]
        code = errors[0].get("code") if isinstance(errors[0], dict) else None
        if code == WINDOW_CLOSED:
            self.window_closed += 1
        self.last_error = f"delivery failed ({code})"
        log.warning(
            "whatsapp could not deliver %s to %s (error %s%s)",
            status.get("id"),
            status.get("recipient_id"),
            code,
            ": the 24-hour window is closed" if code == WINDOW_CLOSED else "",
        )

    # --- Graph API ----------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self._token}"},
                timeout=aiohttp.ClientTimeout(total=30),
                trace_configs=[send_by_trace()],  # a reply that set out late stops here
            )
        try:
            async with self._http.request(method, f"{self._base}/{path}", json=body) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = None
                if resp.status >= 400 or (isinstance(data, dict) and "error" in data):
                    raise graph_error(resp.status, data, resp.headers.get("Retry-After"))
                return data
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransientError(f"whatsapp unreachable ({type(exc).__name__})") from exc

    async def _whoami(self) -> str:
        """Who the credentials belong to: the business number's name."""
        data = await self._call("GET", f"{self._number}?fields=verified_name,display_phone_number")
        data = data if isinstance(data, dict) else {}
        return str(data.get("verified_name") or data.get("display_phone_number") or self._number)

    async def send(self, msg: OutboundMessage) -> SentRef:
        self._stop_typing(msg.chat_id)
        ids: list[str] = []
        for i, part in enumerate(split_message(to_whatsapp(msg.text), LIMIT)):
            body: dict[str, Any] = {
                "messaging_product": "whatsapp",
                "recipient_type": "individual",
                "to": msg.chat_id,
                "type": "text",
                "text": {"body": part},
            }
            if i == 0 and msg.reply_to:
                body["context"] = {"message_id": msg.reply_to}
            try:
                data = await call_with_retry(
                    functools.partial(self._call, "POST", f"{self._number}/messages", body),
                    backoff=self._backoff,
                    log=log,
                )
            except WindowClosed as exc:
                self.window_closed += 1
                self.last_error = "24-hour window closed"
                log.warning("not sent to %s and not retried: %s", msg.chat_id, exc)
                raise
            except InvalidToken as exc:
                self.last_error = "invalid token"
                log.error(
                    "whatsapp refused the access token; replies fail until it is fixed (%s)", exc
                )
                raise
            except AdapterError as exc:
                self.last_error = str(exc)
                raise
            ids += [str(m.get("id")) for m in (data or {}).get("messages") or []]
        return SentRef(self.platform, msg.chat_id, tuple(ids))

    # The typing indicator marks the user's message read and shows "typing..." until the
    # reply arrives or 25 s pass (Meta's limit); one call per turn is enough.
    def turn_started(self, msg: InboundMessage) -> None:
        if msg.platform_message_id and msg.source.chat_id not in self._typing:
            body = {
                "messaging_product": "whatsapp",
                "status": "read",
                "message_id": msg.platform_message_id,
                "typing_indicator": {"type": "text"},
            }
            self._typing[msg.source.chat_id] = asyncio.create_task(
                self._typing_once(msg.source.chat_id, body),
                name=f"whatsapp.typing:{msg.source.chat_id}",
            )

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        self._stop_typing(msg.source.chat_id)

    def _stop_typing(self, chat_id: str) -> None:
        task = self._typing.pop(chat_id, None)
        if task is not None and not task.done():
            task.cancel()

    async def _typing_once(self, chat_id: str, body: dict[str, Any]) -> None:
        with contextlib.suppress(AdapterError):
            await self._call("POST", f"{self._number}/messages", body)
