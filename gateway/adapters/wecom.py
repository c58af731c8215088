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
    split_message,
)
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
from gateway.messages import OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, setting
from gateway.session_keys import SessionSource
from gateway.shards import CLAIM_EVERY_S, Receiver, ShardLedger
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.wecom")
REPLY_IDS = 5_000  # msgid -> req_id of the callbacks most recently taken


def gateway_url(v: Any) -> str | None:
    if v is None:
        return None
    parts = urlsplit(str(v))
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        return f"must be a websocket URL such as {DEFAULT_URL} (got {v!r})"
    return None


@dataclass(frozen=True)
class WeComSettings(PlatformSettings):
    bot_id_env: str | None = setting(None, env_name, "WeCom AI bot id env var")


class WeComAdapter(UsesShards, Outbound, SetupSteps):
    platform: ClassVar[str] = PLATFORM
    settings: ClassVar[type[WeComSettings]] = WeComSettings
    library_loggers: ClassVar[tuple[str, ...]] = ()

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: WeComSettings) -> list[SecretNeed]:
        return [
            SecretNeed("token_env", "WECOM_SECRET", "the WeCom AI bot's secret"),
            SecretNeed("bot_id_env", "WECOM_BOT_ID", "the WeCom AI bot's id"),
        ]

    @classmethod
    def problems(cls, settings: WeComSettings, api_enabled: bool) -> list[ConfigError]:
        bad = gateway_url(settings.base_url)
        return [ConfigError("platforms.wecom.base_url", bad)] if bad else []

    @classmethod
    def from_config(cls, settings: WeComSettings, secrets: Mapping[str, str]) -> WeComAdapter:
        return cls(
            secrets.get("bot_id_env", ""), secrets.get("token_env", ""), url=settings.base_url
        )

    def routes(self) -> Mapping[str, Route]:
        return {}  # messages arrive over the connection the adapter opens

    @classmethod
    def setup_steps(cls, settings: WeComSettings) -> list[str]:
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
        running daemon's connection is taken over for that moment and comes back."""
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

    @classmethod
    def thread_source(cls, thread: ThreadRef) -> SessionSource:
        """WeCom has no threads; a handoff lands in the home chat itself."""
        return SessionSource(cls.platform, thread.chat_id, ChatType.GROUP)

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        bot_id: str,
        secret: str,
        *,
        url: str | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        heartbeat_s: float = 30.0,
    ) -> None:
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
        await self._receiver.start()
        self.state = AdapterState.RUNNING

    async def open_outbound(self) -> None:
        """Ready to send without the daemon: the bot's connection, opened and subscribed
        for the send (a callback arriving meanwhile is not taken: no daemon stores it)."""
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
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
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

    async def send(self, msg: OutboundMessage) -> SentRef:
        ids = []
        for i, part in enumerate(split_message(msg.text, MARKDOWN_BYTES, utf8_len)):
            try:
                sent = await call_with_retry(
                    lambda p=part, n=i: self._send_one(msg, p, n),  # type: ignore[misc]
                    backoff=self._backoff,
                    log=log,
                )
            except AdapterError as exc:
                self.last_error = str(exc)
                raise
            if sent:
                ids.append(sent)
        return SentRef(self.platform, msg.chat_id, tuple(ids))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """WeCom has no threads: a handoff goes to the home chat itself."""
        return None
