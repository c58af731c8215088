"""iMessage through a BlueBubbles Server: its webhooks in (served on the daemon's HTTP server),
its REST API (`/api/v1/...`, the server password as the `password` query parameter) out.

BlueBubbles signs nothing, so its webhook URL carries a secret of our own
(`/bluebubbles/webhook?secret=...`), compared in constant time before the body is read.
Replays are caught by the core's dedupe on the message guid and by the age check on
`dateCreated`. A chat guid `iMessage;-;+1555...` is a DM, `iMessage;+;chat...` a group.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar
from urllib.parse import quote

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
from gateway.adapters.kit.chats import AsksWhoami, NoThreads
from gateway.adapters.kit.lifecycle import start_whoami
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.webhook import WebhookReplies, api_server_off, committed, taking
from gateway.adapters.sms import plain_text
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    PlatformRefused,
    RetryAfter,
    TransientError,
)
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, in_range, one_of, setting
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.bluebubbles")
REPLIES = WebhookReplies()  # text/plain refusals
WEBHOOK_PATH = "/bluebubbles/webhook"
# iMessage publishes no length limit; Messages.app accepts far more, but an AppleScript send
# of a very long text is slow and shows as one wall, so replies are cut at 4,000 characters
LIMIT = 4_000
RATE_LIMIT_WAIT_S = 2.0  # when a 429 (from a proxy in front of the server) has no Retry-After
ATTACHMENT_NOTE = "(an attachment: only text is read here)"


def _url(v: Any) -> str | None:
    return None if re.fullmatch(r"https?://\S+", str(v)) else f"must be an http(s) URL (got {v!r})"


@dataclass(frozen=True)
class BlueBubblesSettings(PlatformSettings):
    url: str | None = setting(None, _url, "the BlueBubbles Server's URL")
    webhook_secret_env: str | None = setting(
        None, env_name, "env var holding the secret in the webhook URL"
    )
    bot_name: str | None = setting(None, doc="the name that addresses the bot in group chats")
    method: str = setting("apple-script", one_of("apple-script", "private-api"), "how sends go")
    private_api: bool = setting(False, doc="the server's Private API is on: typing indicators")
    max_age_seconds: int = setting(3_600, in_range(60, 7 * 86_400), "older messages are dropped")


# --- translation (pure) ---------------------------------------------------------------


def is_group(chat_guid: str) -> bool:
    """`service;+;id` is a group chat, `service;-;address` a DM."""
    return ";+;" in chat_guid


def addressed(text: str, bot_name: str | None) -> tuple[bool, str]:
    """Whether a group message names the bot (`@name` anywhere, or `name,` / `name:` first),
    and the text with a leading mention removed (so `@bot /help` is a command)."""
    if not bot_name or not bot_name.strip():
        return False, text
    name = re.escape(bot_name.strip())
    lead = re.match(rf"\s*(@{name}\b[\s,:]*|{name}[,:]\s*)", text, re.I)
    if lead:
        return True, text[lead.end() :].strip() or text.strip()
    return bool(re.search(rf"(?<!\w)@{name}\b", text, re.I)), text


def to_inbound(
    payload: Mapping[str, Any], bot_name: str | None = None, require_mention: bool = True
) -> InboundMessage | None:
    """A BlueBubbles webhook (`{"type": "new-message", "data": message}`) as an
    InboundMessage; None for other events, our own messages, tapbacks and system items."""
    if not isinstance(payload, Mapping) or payload.get("type") != "new-message":
        return None
    data = payload.get("data")
    if not isinstance(data, Mapping) or data.get("isFromMe"):
        return None
    if data.get("associatedMessageType") or (data.get("itemType") or 0) != 0:
        return None  # a tapback, or a group rename / member change
    guid, handle = data.get("guid"), data.get("handle")
    address = handle.get("address") if isinstance(handle, Mapping) else None
    if not isinstance(guid, str) or not guid or not isinstance(address, str) or not address:
        return None
    chats = data.get("chats")
    chat = chats[0] if isinstance(chats, list) and chats and isinstance(chats[0], Mapping) else {}
    service = (
        str(handle.get("service") or "iMessage") if isinstance(handle, Mapping) else "iMessage"
    )
    chat_guid = str(chat.get("guid") or f"{service};-;{address}")
    raw = data.get("text")
    text = raw if isinstance(raw, str) else ""
    text = text.replace("\ufffc", "").strip()  # the object-replacement mark of an attachment
    if data.get("attachments"):
        text = f"{ATTACHMENT_NOTE} {text}".strip()
    if not text:
        return None
    group = is_group(chat_guid)
    mentioned = True
    if group:
        mentioned, text = addressed(text, bot_name)
        mentioned = mentioned or not require_mention
    try:
        sent_at = float(data.get("dateCreated") or 0) / 1000.0
    except (TypeError, ValueError):
        sent_at = 0.0
    source = SessionSource(
        "bluebubbles",
        chat_guid,
        ChatType.GROUP if group else ChatType.DM,
        address,
        chat_name=str(chat.get("displayName") or "") or None,
    )
    return InboundMessage(
        source,
        text,
        platform_message_id=guid,
        received_at=sent_at,
        mentioned=mentioned,
        reply_to=guid,
    )


def api_error(status: int, body: Any, retry_after: str | None = None) -> Exception:
    """The gateway error for a failed REST call (`{"status", "message", "error": {type,
    message}}` is BlueBubbles' shape)."""
    error = body.get("error") if isinstance(body, dict) else None
    detail = (
        str((error or {}).get("message") if isinstance(error, dict) else "") or f"HTTP {status}"
    )
    if status == 429:
        try:
            return RetryAfter(float(retry_after) if retry_after else RATE_LIMIT_WAIT_S)
        except ValueError:
            return RetryAfter(RATE_LIMIT_WAIT_S)
    if status in (401, 403):
        return InvalidToken(f"bluebubbles refused the server password ({status})")
    if status >= 500:
        return TransientError(f"bluebubbles answered {status}: {detail}")
    return PlatformRefused(f"bluebubbles refused the call ({status}): {detail}")


def already_queued(exc: AdapterError) -> bool:
    """BlueBubbles refuses a tempGuid it is still sending: the first attempt is under way."""
    return "already queued" in str(exc).lower()


# --- the adapter ------------------------------------------------------------------------


class BlueBubblesAdapter(NoThreads, AsksWhoami, Typing, Outbound, SetupSteps):
    platform: ClassVar[str] = "bluebubbles"
    settings: ClassVar[type[BlueBubblesSettings]] = BlueBubblesSettings
    library_loggers: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def secrets_needed(cls, settings: BlueBubblesSettings) -> list[SecretNeed]:
        return [
            SecretNeed("token_env", "BLUEBUBBLES_PASSWORD", "the BlueBubbles server password"),
            SecretNeed(
                "webhook_secret_env", "BLUEBUBBLES_WEBHOOK_SECRET", "the webhook URL's secret"
            ),
        ]

    @classmethod
    def problems(cls, settings: BlueBubblesSettings, api_enabled: bool) -> list[ConfigError]:
        out = api_server_off(cls.platform, api_enabled)
        if not settings.url:
            out.append(
                ConfigError(
                    "platforms.bluebubbles.url",
                    "is required (the server's address, e.g. http://mac.local:1234)",
                )
            )
        if settings.require_mention and not (settings.bot_name or "").strip():
            out.append(
                ConfigError(
                    "platforms.bluebubbles.bot_name",
                    "is required for the "
                    "mention rule in group chats (or set require_mention: false)",
                )
            )
        if settings.method == "private-api" and not settings.private_api:
            out.append(
                ConfigError(
                    "platforms.bluebubbles.method",
                    "private-api needs private_api: true (the server's Private API)",
                )
            )
        return out

    @classmethod
    def from_config(
        cls, settings: BlueBubblesSettings, secrets: Mapping[str, str]
    ) -> BlueBubblesAdapter:
        return cls(
            str(settings.base_url or settings.url),
            secrets.get("token_env", ""),
            secrets.get("webhook_secret_env", ""),
            bot_name=settings.bot_name,
            require_mention=settings.require_mention,
            method=settings.method,
            private_api=settings.private_api,
            max_age_s=settings.max_age_seconds,
        )

    @classmethod
    def setup_steps(cls, settings: BlueBubblesSettings) -> list[str]:
        """What to do on bluebubbles's side (`switchboard setup` prints it)."""
        return [
            "BlueBubbles Server on a Mac signed in to Messages: set its server password "
            "(BLUEBUBBLES_PASSWORD) and make its REST API reachable at url",
            "add a webhook for New Messages at the URL below with "
            "?secret=<BLUEBUBBLES_WEBHOOK_SECRET> appended (a long random value of yours)",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {WEBHOOK_PATH: self.handle_webhook}

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        return "group" if is_group(chat_id) else "dm"

    @classmethod
    def thread_source(cls, thread: ThreadRef) -> SessionSource:
        """iMessage has no threads; a handoff lands in the home chat itself."""
        group = is_group(thread.chat_id)
        return SessionSource(
            cls.platform,
            thread.chat_id,
            ChatType.GROUP if group else ChatType.DM,
            None if group else thread.chat_id.rpartition(";")[2],
        )

    def __init__(
        self,
        url: str,
        password: str,
        webhook_secret: str,
        *,
        bot_name: str | None = None,
        require_mention: bool = True,
        method: str = "apple-script",
        private_api: bool = False,
        max_age_s: float = 3_600,
        timeout_s: float = 60.0,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self._base = url.rstrip("/")
        self._password = password
        self._secret = webhook_secret
        self._bot_name = bot_name
        self._require_mention = require_mention
        self._method = method
        self._private_api = private_api
        self._max_age = max_age_s
        self._timeout = timeout_s
        self._backoff = backoff
        self._http: Any = None  # aiohttp.ClientSession, made on first use
        self._emit: Emit | None = None
        self._typing: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # typing calls in flight
        self.account: str | None = None
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None
        self.stale_dropped = 0

    # --- lifecycle ------------------------------------------------------------------

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        self.account = await start_whoami(
            self,
            self._whoami,
            by="bluebubbles",
            credential="server password",
            refused_as="bad password",
            unreachable=f"could not reach the server at {self._base}",
            log=log,
        )
        log.info("bluebubbles webhook at %s for %s", WEBHOOK_PATH, self.account or self._base)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._typing.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "account": self.account,
            "last_error": self.last_error,
            "stale_dropped": self.stale_dropped,
        }

    # --- webhook --------------------------------------------------------------------

    async def handle_webhook(self, request: Any) -> Any:
        """POST: the URL's secret first; then the message goes to the core, and the
        delivery is acknowledged only once it was accepted (503 makes it come again)."""
        from aiohttp import web

        given = request.query.get("secret")
        if not given:
            return web.Response(status=401, text="missing secret")
        if not self._secret or not hmac.compare_digest(given.encode(), self._secret.encode()):
            log.warning("refused a webhook POST with a wrong secret")
            return web.Response(status=403, text="bad secret")
        if (emit := taking(self._emit, self.state)) is None:
            return REPLIES.stopped()
        try:
            payload = json.loads(await request.read())
        except ValueError:
            return web.Response(status=400, text="not JSON")
        msg = to_inbound(payload, self._bot_name, self._require_mention)
        if msg is None:
            return web.Response(text="ignored")
        age = time.time() - msg.received_at
        if age > self._max_age:
            self.stale_dropped += 1
            log.info(
                "dropped stale message %s (%.0fs old, limit %.0fs)",
                msg.platform_message_id,
                age,
                self._max_age,
            )
            return web.Response(text="stale")
        if not await committed(emit, [msg]):
            return REPLIES.again()
        return web.Response(text="ok")

    # --- REST API -------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                trace_configs=[send_by_trace()],  # a reply that set out late stops here
            )
        url = f"{self._base}/api/v1/{path}"
        try:
            async with self._http.request(
                method, url, params={"password": self._password}, json=body
            ) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = None
                if resp.status >= 400:
                    raise api_error(resp.status, data, resp.headers.get("Retry-After"))
                return data
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransientError(f"bluebubbles unreachable ({type(exc).__name__})") from exc

    async def _whoami(self) -> str:
        """Who the credentials belong to: the server's account."""
        data = await self._call("GET", "server/info")
        info = data.get("data") if isinstance(data, dict) else None
        info = info if isinstance(info, dict) else {}
        name = info.get("detected_imessage") or info.get("computer_id") or self._base
        version = info.get("server_version")
        return f"{name} (BlueBubbles {version})" if version else str(name)

    async def send(self, msg: OutboundMessage) -> SentRef:
        await self._stop_typing(msg.chat_id)
        ids: list[str] = []
        for part in split_message(plain_text(msg.text), LIMIT):
            # one tempGuid per part, kept across retries: the server refuses a tempGuid it
            # is still sending, so a retry after a timed-out attempt is not sent twice
            body = {
                "chatGuid": msg.chat_id,
                "message": part,
                "method": self._method,
                "tempGuid": f"switchboard-{uuid.uuid4()}",
            }
            try:
                data = await call_with_retry(
                    partial(self._call, "POST", "message/text", body),
                    backoff=self._backoff,
                    log=log,
                )
            except InvalidToken as exc:
                self.last_error = "bad password"
                log.error(
                    "bluebubbles refused the server password; replies fail until it is fixed (%s)",
                    exc,
                )
                raise
            except AdapterError as exc:
                if not already_queued(exc):
                    self.last_error = str(exc)
                    raise
                log.info("part %s is already being sent by the server", body["tempGuid"])
                data = None
            sent = data.get("data") if isinstance(data, dict) else None
            ids.append(str((sent or {}).get("guid") or body["tempGuid"]))
        return SentRef(self.platform, msg.chat_id, tuple(ids))

    # Typing needs the server's Private API; without it the calls would only fail.
    def turn_started(self, msg: InboundMessage) -> None:
        chat = msg.source.chat_id
        if self._private_api and chat not in self._typing:
            self._typing.add(chat)
            self._spawn(self._quietly("POST", f"chat/{quote(chat, safe='')}/typing"), chat)

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        if msg.source.chat_id in self._typing:
            self._spawn(self._stop_typing(msg.source.chat_id), msg.source.chat_id)

    def _spawn(self, coro: Any, chat: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"bluebubbles.typing:{chat}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop_typing(self, chat: str) -> None:
        if chat in self._typing:
            self._typing.discard(chat)
            await self._quietly("DELETE", f"chat/{quote(chat, safe='')}/typing")

    async def _quietly(self, method: str, path: str) -> None:
        with contextlib.suppress(AdapterError):
            await self._call(method, path)
