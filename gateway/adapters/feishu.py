"""Feishu / Lark, on lark-oapi: events by webhook on the daemon's HTTP server, replies
through lark-oapi's async IM client (`im.v1.message.acreate` / `areply`).

The webhook checks each request itself (feishu_events.open_request) before anything is
stored, and answers 2xx only after `emit` returned; lark-oapi's own dispatcher decrypts
before it verifies, answers 500 to forgeries, has no timestamp window and calls handlers
synchronously. The tenant token is fetched through lark-oapi's async transport and passed
to each call (its built-in fetch is a blocking `requests` call). Feishu has no typing signal.

Each part of a reply carries a `uuid` derived from the reply's dedupe key: Feishu sends at
most one message per uuid within an hour, so a resend after a crash, and a reply sent late
by a replica that stood still while another took its chat over, show once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any, ClassVar
from urllib.parse import urlsplit

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Emit,
    Outbound,
    Route,
    SetupSteps,
    call_with_retry,
    failed,
)
from gateway.adapters.feishu_events import Refused, card, card_size, open_request, to_inbound
from gateway.adapters.kit.chats import OpensThreads
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.webhook import WebhookReplies, api_server_off, committed
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    PlatformRefused,
    RetryAfter,
    TransientError,
)
from gateway.messages import OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, setting
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.feishu")
REPLIES = WebhookReplies("msg", deliver_again="not stored, deliver again")
EVENTS_PATH = "/feishu/events"
DEFAULT_DOMAIN = "https://open.feishu.cn"
LARK_DOMAIN = "https://open.larksuite.com"
LIMIT = 28_000  # bytes of escaped markdown per card: Feishu takes card bodies up to 30 KB
RATE_LIMITED = 99991400
TOKEN_INVALID = {99991661, 99991663, 99991664, 99991668}  # the tenant token expired or is bad
SEEN = 10_000


@dataclass(frozen=True)
class FeishuSettings(PlatformSettings):
    app_id_env: str | None = setting(None, env_name, "Feishu App ID env var")
    encrypt_key_env: str | None = setting(None, env_name, "Feishu Encrypt Key env var")
    verification_token_env: str | None = setting(
        None, env_name, "Feishu Verification Token env var"
    )


def _is_origin(url: str) -> bool:
    """What lark-oapi accepts as a domain: https://host[:port], or http on loopback."""
    parts = urlsplit(url.rstrip("/"))
    loopback = parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1")
    plain = not (parts.path or parts.query or parts.fragment or "@" in parts.netloc)
    return bool(parts.netloc) and plain and (parts.scheme == "https" or loopback)


def receive_id_type(chat_id: str) -> str:
    """How Feishu reads an id we send to: a user's open_id (ou_), union_id (on_) or a chat."""
    return {"ou_": "open_id", "on_": "union_id"}.get(chat_id[:3], "chat_id")


def reply_uuid(dedupe_key: str, chat_id: str, part: int) -> str:
    """The uuid of one part of a reply: the same on every send of that part, distinct across
    keys, chats and parts, and within Feishu's 50 characters (32 hex digits)."""
    seed = f"{dedupe_key}\x00{chat_id}\x00{part}".encode()
    return hashlib.blake2b(seed, digest_size=16).hexdigest()


class FeishuAdapter(OpensThreads, Outbound, SetupSteps):
    platform: ClassVar[str] = "feishu"
    # a thread is keyed by its root message's id in its chat
    thread_chat_type: ClassVar[ChatType] = ChatType.GROUP
    idempotent_replies: ClassVar[bool] = True  # a uuid per part, derived from the reply's key
    settings: ClassVar[type[FeishuSettings]] = FeishuSettings
    library_loggers: ClassVar[tuple[str, ...]] = ("Lark",)

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: FeishuSettings) -> list[SecretNeed]:
        return [
            SecretNeed("token_env", "FEISHU_APP_SECRET", "the Feishu app secret"),
            SecretNeed("app_id_env", "FEISHU_APP_ID", "the Feishu app id, cli_..."),
            SecretNeed("encrypt_key_env", "FEISHU_ENCRYPT_KEY", "event signing and encryption"),
            SecretNeed("verification_token_env", "FEISHU_VERIFICATION_TOKEN", "event verification"),
        ]

    @classmethod
    def problems(cls, settings: FeishuSettings, api_enabled: bool) -> list[ConfigError]:
        found = []
        if find_spec("lark_oapi") is None:
            found.append(
                ConfigError(
                    "platforms.feishu",
                    "needs the lark-oapi package: pip install 'switchboard[feishu]'",
                )
            )
        if settings.base_url and not _is_origin(settings.base_url):
            found.append(
                ConfigError(
                    "platforms.feishu.base_url",
                    f"must be an https origin such as {LARK_DOMAIN} (got {settings.base_url!r})",
                )
            )
        found += api_server_off(cls.platform, api_enabled, served="Feishu events are")
        return found

    @classmethod
    def from_config(cls, settings: FeishuSettings, secrets: Mapping[str, str]) -> FeishuAdapter:
        return cls(
            secrets.get("app_id_env", ""),
            secrets.get("token_env", ""),
            secrets.get("encrypt_key_env", ""),
            secrets.get("verification_token_env", ""),
            domain=settings.base_url,
            require_mention=settings.require_mention,
        )

    @classmethod
    def setup_steps(cls, settings: FeishuSettings) -> list[str]:
        """What to do on feishu's side (`switchboard setup` prints it)."""
        return [
            "open.feishu.cn (or open.larksuite.com): a custom app with the Bot feature; copy "
            "the App ID and App Secret (FEISHU_APP_ID, FEISHU_APP_SECRET)",
            "Events & Callbacks: set an Encrypt Key (FEISHU_ENCRYPT_KEY), copy the "
            "Verification Token (FEISHU_VERIFICATION_TOKEN), send events to the URL below "
            "and add im.message.receive_v1; grant read and send message scopes; publish",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {EVENTS_PATH: self.handle_events}

    @classmethod
    async def check_credentials(
        cls, settings: FeishuSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        adapter = cls(
            secrets.get("app_id_env", ""),
            secrets.get("token_env", ""),
            "",
            "",
            domain=settings.base_url,
            attempts=1,
        )
        try:
            bot = await adapter._bot_info()
        except TransientError as exc:
            return False, f"unreachable ({type(exc.__cause__ or exc).__name__})"
        except AdapterError as exc:  # the credentials, or the bot's own settings, refused
            return False, str(exc)
        return True, str(bot.get("app_name") or bot.get("open_id"))

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """A user's open_id (ou_...) is a DM; a chat_id (oc_...) is taken as a group."""
        return "dm" if chat_id.startswith(("ou_", "on_")) else "group"

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        app_id: str,
        app_secret: str,
        encrypt_key: str,
        verification_token: str,
        *,
        domain: str | None = None,
        require_mention: bool = True,
        backoff: Backoff = DEFAULT_BACKOFF,
        clock: Callable[[], float] = time.time,
        attempts: int = 6,
    ) -> None:
        self._attempts = attempts
        self._app_id, self._secret = app_id, app_secret
        self._encrypt_key, self._verification_token = encrypt_key, verification_token
        self._domain = (domain or DEFAULT_DOMAIN).rstrip("/")
        self._require_mention, self._backoff, self._clock = require_mention, backoff, clock
        self._client: Any = None
        self._token: tuple[str, float] | None = None  # (tenant_access_token, expires at)
        self._emit: Emit | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._active_threads: set[tuple[str, str]] = set()
        self._groups: set[str] = set()
        self.bot_open_id: str | None = None
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    async def open_outbound(self) -> dict[str, Any]:
        """Ready to send, receiving nothing (`switchboard send` without a daemon; events
        are posted to the daemon's route): a tenant token and the bot's info."""
        return await self._bot_info()

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        try:
            bot = await self._bot_info()
        except InvalidToken:
            self.state = failed("invalid app secret")
            log.error("feishu refused the app id/secret; the adapter is stopped")
            raise
        self.bot_open_id = bot.get("open_id")
        self.state = AdapterState.RUNNING

    async def stop(self) -> None:
        self._emit = None
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {"state": self.state, "bot_open_id": self.bot_open_id, "last_error": self.last_error}

    async def handle_events(self, request: Any) -> Any:
        """POST /feishu/events: verify first, then emit, then answer (2xx only once the
        message is committed or decided; 503 makes Feishu deliver it again)."""
        from aiohttp import web

        body = await request.read()
        try:
            opened = open_request(
                request.headers,
                body,
                encrypt_key=self._encrypt_key,
                verification_token=self._verification_token,
                now=self._clock(),
            )
        except Refused as exc:
            log.warning("refused a Feishu event request: %s", exc)
            return web.json_response({"msg": str(exc)}, status=exc.status)
        if opened.challenge is not None:
            return web.json_response({"challenge": opened.challenge})
        event_id = str((opened.event.get("header") or {}).get("event_id") or "")
        if (emit := self._emit) is None:  # stopped: Feishu will deliver it again
            return REPLIES.stopped()
        if event_id and event_id in self._seen:
            return web.json_response({"msg": "success"})  # a redelivery of a taken event
        msg = to_inbound(
            opened.event, self.bot_open_id, self._active_threads, self._require_mention
        )
        if msg is not None:
            if msg.source.chat_type == ChatType.GROUP:
                self._groups.add(msg.source.chat_id)
            if msg.mentioned and msg.source.thread_id:
                self._active_threads.add((msg.source.chat_id, msg.source.thread_id))
            if not await committed(emit, [msg]):
                return REPLIES.again()
        if event_id:
            self._seen[event_id] = None
            if len(self._seen) > SEEN:
                self._seen.popitem(last=False)
        return web.json_response({"msg": "success"})

    # --- the Open API, through lark-oapi ------------------------------------------------

    async def _lark(self) -> Any:
        if self._client is None:
            # importing lark_oapi takes seconds (it loads every API): not on the event loop
            lark = await asyncio.to_thread(__import__, "lark_oapi")
            self._client = (
                lark.Client.builder()
                .app_id(self._app_id)
                .app_secret(self._secret)
                .domain(self._domain)
                .enable_set_token(True)
                .timeout(15)
                .log_level(lark.LogLevel.WARNING)
                .build()
            )
        return self._client

    async def _tenant_token(self) -> str:
        if self._token and self._token[1] > self._clock():
            return self._token[0]
        from lark_oapi.api.auth.v3 import (
            InternalTenantAccessTokenRequest,
            InternalTenantAccessTokenRequestBody,
        )

        client = await self._lark()
        body = (
            InternalTenantAccessTokenRequestBody.builder()
            .app_id(self._app_id)
            .app_secret(self._secret)
            .build()
        )
        resp = await self._transport(
            lambda: client.auth.v3.tenant_access_token.ainternal(
                InternalTenantAccessTokenRequest.builder().request_body(body).build()
            )
        )
        data = json.loads(resp.raw.content or b"{}")
        if data.get("code") != 0 or not data.get("tenant_access_token"):
            raise InvalidToken(
                f"feishu refused the app credentials: {data.get('msg')} ({data.get('code')})"
            )
        self._token = (
            str(data["tenant_access_token"]),
            self._clock() + int(data.get("expire", 7200)) - 600,
        )
        return self._token[0]

    async def _transport(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """One lark-oapi call with its failure typed: rate limits, server and network
        trouble, an expired token (dropped so the retry fetches another)."""
        import httpx

        try:
            resp = await call()
        except (httpx.HTTPError, OSError) as exc:
            raise TransientError(f"feishu unreachable ({type(exc).__name__})") from exc
        raw = resp.raw
        if resp.code == RATE_LIMITED or raw.status_code == 429:
            raise RetryAfter(float(raw.headers.get("x-ogw-ratelimit-reset") or 1))
        if raw.status_code >= 500:
            raise TransientError(f"feishu answered {raw.status_code}")
        if resp.code in TOKEN_INVALID:
            self._token = None
            raise TransientError("the tenant token expired")
        return resp

    async def _api(self, call: Callable[[Any, Any], Awaitable[Any]]) -> Any:
        """`call(client, option)` with a tenant token, retried as base.call_with_retry does;
        the response's data, or AdapterError with Feishu's code."""
        from lark_oapi.core.model import RequestOption

        async def attempt() -> Any:
            client, token = await self._lark(), await self._tenant_token()
            option = RequestOption.builder().tenant_access_token(token).build()
            return await self._transport(lambda: call(client, option))

        resp = await call_with_retry(
            attempt, backoff=self._backoff, attempts=self._attempts, log=log
        )
        if resp.code != 0:
            self.last_error = f"{resp.msg} ({resp.code})"
            raise PlatformRefused(f"feishu refused the call: {self.last_error}")
        return resp

    async def _bot_info(self) -> dict[str, Any]:
        """GET /open-apis/bot/v3/info: the bot's name and open_id (which mentions carry)."""
        from lark_oapi.core.enum import AccessTokenType, HttpMethod
        from lark_oapi.core.model import BaseRequest

        def info(client: Any, option: Any) -> Awaitable[Any]:
            req = (
                BaseRequest.builder()
                .http_method(HttpMethod.GET)
                .uri("/open-apis/bot/v3/info")
                .token_types({AccessTokenType.TENANT})
                .build()
            )
            reply: Awaitable[Any] = client.arequest(req, option)
            return reply

        resp = await self._api(info)
        return dict(json.loads(resp.raw.content).get("bot") or {})

    async def _post(
        self,
        chat_id: str,
        text: str,
        *,
        reply_to: str | None = None,
        in_thread: bool = False,
        key: str | None = None,
    ) -> Any:
        """One card: a reply to `reply_to` (in its thread when `in_thread`), else a new message.
        The uuid (`key`, else a random one) makes Feishu answer a repeat within the hour with
        the message it made: a retry after a lost answer, a resend, a stalled replica's send."""
        from lark_oapi.api.im.v1 import (
            CreateMessageRequest,
            CreateMessageRequestBody,
            ReplyMessageRequest,
            ReplyMessageRequestBody,
        )

        key = key or uuid.uuid4().hex
        if reply_to:
            reply = (
                ReplyMessageRequest.builder()
                .message_id(reply_to)
                .request_body(
                    ReplyMessageRequestBody.builder()
                    .msg_type("interactive")
                    .content(card(text))
                    .reply_in_thread(in_thread)
                    .uuid(key)
                    .build()
                )
                .build()
            )
            resp = await self._api(lambda c, o: c.im.v1.message.areply(reply, o))
        else:
            create = (
                CreateMessageRequest.builder()
                .receive_id_type(receive_id_type(chat_id))
                .request_body(
                    CreateMessageRequestBody.builder()
                    .receive_id(chat_id)
                    .msg_type("interactive")
                    .content(card(text))
                    .uuid(key)
                    .build()
                )
                .build()
            )
            resp = await self._api(lambda c, o: c.im.v1.message.acreate(create, o))
        return resp.data

    async def send(self, msg: OutboundMessage) -> SentRef:
        ids = []
        for i, part in enumerate(split_message(msg.text, LIMIT, card_size)):
            key = reply_uuid(msg.dedupe_key, msg.chat_id, i) if msg.dedupe_key else None
            if msg.thread_id:
                data = await self._post(
                    msg.chat_id, part, reply_to=msg.thread_id, in_thread=True, key=key
                )
            elif msg.reply_to and msg.chat_id in self._groups and i == 0:
                data = await self._post(msg.chat_id, part, reply_to=msg.reply_to, key=key)  # quote
            else:
                data = await self._post(msg.chat_id, part, key=key)
            ids.append(str(data.message_id))
        if msg.thread_id:
            self._active_threads.add((msg.chat_id, msg.thread_id))
        return SentRef(self.platform, msg.chat_id, tuple(ids))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """A root message in the group; the thread is addressed by the root's id, and the
        first `send` to it (a reply with reply_in_thread) opens the thread under it."""
        root = await self._post(chat_id, name)
        root_id = str(root.message_id)
        self._active_threads.add((chat_id, root_id))
        self._groups.add(chat_id)
        return ThreadRef(self.platform, chat_id, root_id, name)
