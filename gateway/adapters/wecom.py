"""WeCom (Enterprise WeChat) AI bot, over its long connection: an outbound websocket to
WeCom's gateway (no public endpoint), opened with the bot id and secret (wecom_link).

Messages arrive as callbacks on the connection and are handed to the core one at a time,
in order; WeCom has no acknowledgement of a callback, so what stands for it is the reply,
and a message is committed (emit returned) before anything is answered. A redelivery
(the same msgid after a dropped connection) is a duplicate in the inbox and is answered
once. A reply goes back under the callback's req_id (`aibot_respond_msg`, one finished
stream message of markdown); a handoff, `switchboard send`, a reply whose req_id WeCom
no longer takes, and the later parts of a long reply are active messages
(`aibot_send_msg`, markdown). WeCom has no threads and no typing signal here.

WeCom keeps one connection per bot: a newer one takes over and the older is closed with
a `disconnected_event`. Among replicas one holds it (gateway.shards.Receiver) and sends
too, as every send goes over that connection; a replica without it cannot send.

With `mode: callback` the same adapter serves a self-built app instead: callbacks on the
api server, replies through the app's REST API (wecom_app, wecom_crypto).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Mapping
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
    UsesShards,
    call_with_retry,
    failed,
)
from gateway.adapters.kit.chats import NoThreads
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.webhook import WebhookReplies, api_server_off, committed, taking
from gateway.adapters.wecom_app import (
    APP_MARKDOWN_BYTES,
    CALLBACK_PATH,
    DEFAULT_API,
    AppApi,
    app_inbound,
    open_callback,
    verify_url,
)
from gateway.adapters.wecom_crypto import Refused, aes_key
from gateway.adapters.wecom_link import Link
from gateway.adapters.wecom_wire import (
    DEFAULT_URL,
    MARKDOWN_BYTES,
    PLATFORM,
    RESPOND,
    SEND,
    markdown_message,
    req_id_of,
    stream_reply,
    to_inbound,
    utf8_len,
)
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    NotAccepted,
    RetryAfter,
    TransientError,
)
from gateway.messages import OutboundMessage, SentRef
from gateway.sections import (
    PlatformSettings,
    SecretNeed,
    env_name,
    in_range,
    platform_mode,
    setting,
)
from gateway.shards import CLAIM_EVERY_S, Receiver, ShardLedger
from gateway.vocab import AdapterState

log = logging.getLogger("gateway.adapters.wecom")
REPLY_IDS = 5_000  # msgid -> req_id of the callbacks most recently taken


def gateway_url(v: Any) -> str | None:
    if v is None:
        return None
    parts = urlsplit(str(v))
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        return f"must be a websocket URL such as {DEFAULT_URL} (got {v!r})"
    return None


def api_origin(v: Any) -> str | None:
    parts = urlsplit(str(v))
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        return f"must be an origin such as {DEFAULT_API} in callback mode (got {v!r})"
    return None


@dataclass(frozen=True)
class WeComSettings(PlatformSettings):
    mode: str | None = setting("websocket", platform_mode("wecom", "websocket", "callback"))
    bot_id_env: str | None = setting(None, env_name, "WeCom AI bot id env var")
    corp_id: str | None = setting(None, doc="callback mode: the corp id (企业ID)")
    agent_id: int | None = setting(None, in_range(1, 2**31), "callback mode: the app's AgentId")
    callback_token_env: str | None = setting(None, env_name, "callback mode: the Token env var")
    encoding_aes_key_env: str | None = setting(
        None, env_name, "callback mode: the EncodingAESKey env var"
    )


@dataclass(frozen=True)
class AppMode:
    """Callback mode's parts: the REST API, and what checks and opens a callback."""

    api: AppApi
    token: str
    encoding_aes_key: str


class WeComAdapter(NoThreads, UsesShards, Outbound, SetupSteps):
    platform: ClassVar[str] = PLATFORM
    settings: ClassVar[type[WeComSettings]] = WeComSettings
    library_loggers: ClassVar[tuple[str, ...]] = ()

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: WeComSettings) -> list[SecretNeed]:
        if settings.mode == "callback":
            return [
                SecretNeed("token_env", "WECOM_SECRET", "the WeCom app's secret"),
                SecretNeed("callback_token_env", "WECOM_CALLBACK_TOKEN", "the callback Token"),
                SecretNeed(
                    "encoding_aes_key_env", "WECOM_ENCODING_AES_KEY", "the callback EncodingAESKey"
                ),
            ]
        return [
            SecretNeed("token_env", "WECOM_SECRET", "the WeCom AI bot's secret"),
            SecretNeed("bot_id_env", "WECOM_BOT_ID", "the WeCom AI bot's id"),
        ]

    @classmethod
    def problems(cls, settings: WeComSettings, api_enabled: bool) -> list[ConfigError]:
        if settings.mode != "callback":
            bad = gateway_url(settings.base_url)
            return [ConfigError("platforms.wecom.base_url", bad)] if bad else []
        found = []
        if find_spec("cryptography") is None:
            found.append(
                ConfigError(
                    "platforms.wecom.mode",
                    "callback mode needs the cryptography package: pip install 'switchboard[wecom]'",
                )
            )
        if not settings.corp_id:
            found.append(ConfigError("platforms.wecom.corp_id", "is required in callback mode"))
        if not settings.agent_id:
            found.append(ConfigError("platforms.wecom.agent_id", "is required in callback mode"))
        if settings.base_url and (bad := api_origin(settings.base_url)):
            found.append(ConfigError("platforms.wecom.base_url", bad))
        found += api_server_off(cls.platform, api_enabled, key="mode", served="callback mode is")
        return found

    @classmethod
    def from_config(cls, settings: WeComSettings, secrets: Mapping[str, str]) -> WeComAdapter:
        if settings.mode == "callback":
            api = AppApi(
                str(settings.corp_id),
                secrets.get("token_env", ""),
                int(settings.agent_id or 0),
                settings.base_url,
            )
            app = AppMode(
                api,
                secrets.get("callback_token_env", ""),
                secrets.get("encoding_aes_key_env", ""),
            )
            return cls("", "", app=app)
        return cls(
            secrets.get("bot_id_env", ""), secrets.get("token_env", ""), url=settings.base_url
        )

    def routes(self) -> Mapping[str, Route]:
        if self._app is None:
            return {}  # messages arrive over the connection the adapter opens
        return {f"GET {CALLBACK_PATH}": self._callbacks.verify, CALLBACK_PATH: self._callbacks.take}

    @classmethod
    def setup_steps(cls, settings: WeComSettings) -> list[str]:
        if settings.mode == "callback":
            return [
                "In the WeCom admin console create a self-built app; copy its AgentId, its "
                "Secret (WECOM_SECRET) and the corp id.",
                "Under the app's API message receiving set the URL https://<host>/wecom/callback "
                "and generate a Token (WECOM_CALLBACK_TOKEN) and an EncodingAESKey "
                "(WECOM_ENCODING_AES_KEY); start the daemon before saving.",
                "Add this server's public IP to the app's trusted IPs.",
            ]
        return [
            "In the WeCom admin console open Applications > AI Bot (智能机器人), create a bot "
            "and choose the API mode with a long connection (长连接).",
            "Copy its Bot ID and Secret into WECOM_BOT_ID and WECOM_SECRET.",
            "Add the bot to the group chats it should serve; members @-mention it there.",
        ]

    @classmethod
    async def check_credentials(
        cls, settings: WeComSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        """Subscribes once (WeCom's only check of the bot id and secret) and closes: a
        running daemon's connection is taken over for that moment and comes back. In
        callback mode: an access token for the corp id and the app's secret."""
        if settings.mode == "callback":
            api = AppApi(str(settings.corp_id), secrets.get("token_env", ""), 0, settings.base_url)
            try:
                await api.access_token()
            except InvalidToken as exc:
                return False, str(exc)
            except AdapterError as exc:
                return False, f"unreachable ({type(exc.__cause__ or exc).__name__})"
            finally:
                await api.close()
            return True, f"{settings.corp_id} app {settings.agent_id}"
        bot_id = secrets.get("bot_id_env", "")
        link = Link(settings.base_url or DEFAULT_URL, bot_id, secrets.get("token_env", ""))
        try:
            await link.open()
        except InvalidToken as exc:
            return False, str(exc)
        except AdapterError as exc:
            return False, f"unreachable ({type(exc.__cause__ or exc).__name__})"
        finally:
            await link.close()
        return True, bot_id

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """A user's id and a group's chatid look alike: a configured home channel is taken
        as a group (/sethome in a DM records that chat as a DM)."""
        return "group"

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        bot_id: str,
        secret: str,
        *,
        url: str | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        heartbeat_s: float = 30.0,
        app: AppMode | None = None,
    ) -> None:
        self._app = app
        self._callbacks = Callbacks(self)
        self.bot_id, self._secret = bot_id, secret
        self.url = url or DEFAULT_URL
        self._backoff, self._heartbeat_s = backoff, heartbeat_s
        self._emit: Emit | None = None
        self._link: Link | None = None
        self._loop: asyncio.Task[None] | None = None
        self._req_ids: OrderedDict[str, str] = OrderedDict()
        self._receiver = Receiver(self.platform, self._begin, self._end)
        self._sharded = False
        self.connections = 0
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    def use_shards(self, ledger: ShardLedger) -> None:
        """Among replicas: hold the bot's one connection only while this replica owns it."""
        self._receiver.use(ledger)
        self._sharded = True

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        if self._app is not None:
            await self._start_app(self._app)
            return
        await self._receiver.start()
        self.state = AdapterState.RUNNING

    async def _start_app(self, app: AppMode) -> None:
        """Callback mode: the EncodingAESKey read, the app's secret checked (refused: the
        adapter stops; unreachable: it runs, callbacks arrive and sends retry)."""
        try:
            self._callbacks.key = aes_key(app.encoding_aes_key)
        except ValueError as exc:
            self.state, self.last_error = failed("bad EncodingAESKey"), str(exc)
            log.error("wecom: %s; the adapter is stopped", exc)
            raise InvalidToken(f"wecom cannot use the EncodingAESKey: {exc}") from exc
        try:
            await app.api.access_token()
        except InvalidToken as exc:
            self.state, self.last_error = failed("invalid secret"), str(exc)
            log.error("%s; the adapter is stopped", exc)
            raise
        except AdapterError as exc:  # callbacks still arrive; sends retry
            self.last_error = str(exc)
            log.warning("wecom: no access token yet (%s); taking callbacks anyway", exc)
        self.state = AdapterState.RUNNING
        log.info("wecom callbacks at %s for app %s", CALLBACK_PATH, app.api.agent_id)

    async def open_outbound(self) -> None:
        """Ready to send without the daemon: the bot's connection, opened and subscribed
        for the send (a callback arriving meanwhile is not taken: no daemon stores it);
        in callback mode, the app's access token."""
        if self._app is not None:
            await self._app.api.access_token()
            return
        link = self._link = await self._open()
        self._loop = asyncio.create_task(
            link.serve(self._on_message, self._on_event), name="wecom.outbound"
        )

    async def _open(self) -> Link:
        link = Link(self.url, self.bot_id, self._secret, heartbeat_s=self._heartbeat_s)
        try:
            await call_with_retry(link.open, backoff=self._backoff, log=log)
        except InvalidToken as exc:
            self.state, self.last_error = failed("invalid secret"), str(exc)
            log.error("%s; the adapter is stopped", exc)
            raise
        self.connections += 1
        return link

    async def _begin(self) -> None:
        """This replica holds the connection: open it (a refused secret fails the start)
        and serve it, reconnecting with backoff, until `_end`."""
        self._link = await self._open()
        self._loop = asyncio.create_task(self._serve(self._link), name="wecom.connection")

    async def _end(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def stop(self) -> None:
        self._emit = None
        await self._receiver.stop()
        await self._end()  # the outbound-only connection, if any
        if self._app is not None:
            await self._app.api.close()
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        if self._app is not None:
            return {"state": self.state, "mode": "callback", "last_error": self.last_error}
        return {
            "state": self.state,
            "connections": self.connections,
            "connected": bool(self._link and self._link.open_),
            "last_error": self.last_error,
            **self._receiver.health(),
        }

    async def _serve(self, link: Link) -> None:
        attempt = 0
        while True:
            try:
                await link.serve(self._on_message, self._on_event)
            except Exception as exc:  # a bug in a handler: logged, the connection comes back
                log.exception("the wecom connection failed: %s", exc)
            self._link = None
            if link.replaced:
                self.last_error = "another connection of this bot took over"
                log.warning(
                    "wecom closed this connection for a newer one of the same bot (another "
                    "replica or daemon, doctor or `switchboard send`); reconnecting"
                )
                if self._sharded:  # another replica's takeover ends this loop (Receiver)
                    await asyncio.sleep(2 * CLAIM_EVERY_S)
            else:
                self.last_error = "the connection closed"
                log.warning("the wecom connection closed; reconnecting")
            while self._link is None:
                await asyncio.sleep(self._backoff.delay(attempt))
                attempt = min(attempt + 1, 16)
                try:
                    link = self._link = await self._open()
                except InvalidToken:
                    return
                except (TransientError, RetryAfter) as exc:
                    self.last_error = str(exc)
                    log.warning("wecom reconnect failed: %s", exc)
            attempt = 0

    async def _on_message(self, data: dict[str, Any]) -> None:
        body = data.get("body")
        msg = to_inbound(body) if isinstance(body, Mapping) else None
        emit = self._emit
        if msg is None:
            return
        if emit is None:
            log.warning(
                "wecom message %s arrived while only sending; not taken", msg.platform_message_id
            )
            return
        assert msg.platform_message_id is not None
        self._req_ids[msg.platform_message_id] = req_id_of(data)
        while len(self._req_ids) > REPLY_IDS:
            self._req_ids.popitem(last=False)
        try:
            await emit(msg)
        except NotAccepted as exc:  # nothing was answered: WeCom may deliver it again
            self.last_error = f"a message could not be stored: {exc}"
            log.warning("wecom message %s was not stored (%s)", msg.platform_message_id, exc)

    async def _on_event(self, data: dict[str, Any]) -> None:
        log.debug("wecom event: %.200r", data.get("body"))

    # --- sending --------------------------------------------------------------------------

    def _connected(self) -> Link:
        link = self._link
        if link is not None and link.open_:
            return link
        if self._sharded and not self._receiver.receiving:
            raise TransientError("another replica holds the bot's wecom connection; only it sends")
        raise TransientError("the wecom connection is not open")

    async def _reply(self, req_id: str, stream_id: str, text: str) -> bool:
        """A reply under its callback's req_id; False when WeCom refuses it (the req_id no
        longer taken), so the caller sends an active message instead."""
        try:
            await self._connected().call(
                RESPOND, stream_reply(stream_id, text), req_id=req_id, what="the reply"
            )
        except (TransientError, RetryAfter, InvalidToken):
            raise
        except AdapterError as exc:
            log.info("wecom refused a reply under its callback (%s); sending it instead", exc)
            return False
        return True

    async def _send_one(self, msg: OutboundMessage, text: str, part: int) -> str:
        req_id = self._req_ids.get(msg.reply_to or "") if part == 0 else None
        if req_id:
            seed = f"{msg.dedupe_key or uuid.uuid4().hex}\x00{msg.chat_id}".encode()
            stream_id = hashlib.blake2b(seed, digest_size=16).hexdigest()
            if await self._reply(req_id, stream_id, text):
                return ""
        answer = await self._connected().call(
            SEND, markdown_message(msg.chat_id, text), what="the message"
        )
        return req_id_of(answer)

    async def _send_app(self, app: AppMode, msg: OutboundMessage, text: str) -> str:
        return await app.api.send_markdown(msg.chat_id, text)

    async def send(self, msg: OutboundMessage) -> SentRef:
        ids = []
        app, limit = self._app, MARKDOWN_BYTES if self._app is None else APP_MARKDOWN_BYTES
        for i, part in enumerate(split_message(msg.text, limit, utf8_len)):
            try:
                sent = await call_with_retry(
                    (lambda p=part: self._send_app(app, msg, p))  # type: ignore[misc]
                    if app is not None
                    else (lambda p=part, n=i: self._send_one(msg, p, n)),  # type: ignore[misc]
                    backoff=self._backoff,
                    log=log,
                )
            except AdapterError as exc:
                self.last_error = str(exc)
                raise
            if sent:
                ids.append(sent)
        return SentRef(self.platform, msg.chat_id, tuple(ids))


REPLIES = WebhookReplies()


class Callbacks:
    """Callback mode's two routes on the api server: the URL check and the messages."""

    def __init__(self, adapter: WeComAdapter) -> None:
        self.adapter = adapter
        self.key = b""

    async def verify(self, request: Any) -> Any:
        """GET /wecom/callback: WeCom checks the URL; the decrypted echostr is the answer."""
        from aiohttp import web

        app = self.adapter._app
        if app is None or not self.key:
            return REPLIES.stopped()
        try:
            echo = verify_url(request.query, app.token, self.key, app.api.corp_id)
        except Refused as exc:
            log.warning("refused a WeCom URL check: %s", exc)
            return web.Response(status=exc.status, text=str(exc))
        return web.Response(text=echo)

    async def take(self, request: Any) -> Any:
        """POST /wecom/callback: checked, decrypted, committed, then 200 (503: not stored,
        WeCom posts it again)."""
        from aiohttp import web

        adapter, app = self.adapter, self.adapter._app
        emit = taking(adapter._emit, adapter.state)
        if app is None or emit is None or not self.key:
            return REPLIES.stopped()
        try:
            fields = open_callback(
                request.query, await request.read(), app.token, self.key, app.api.corp_id
            )
        except Refused as exc:
            log.warning("refused a WeCom callback: %s", exc)
            return web.Response(status=exc.status, text=str(exc))
        if not await committed(emit, [app_inbound(fields)]):
            return REPLIES.again()
        return web.Response(text="success")
