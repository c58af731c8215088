"""QQ Bot (the official bot API v2), on aiohttp: the websocket gateway for C2C messages and
group @-messages (qqbot_gateway), passive replies through the send calls (qqbot_api).

QQ takes a bot's message mainly as a passive reply: it names the user's message (`msg_id`)
and a `msg_seq` that differs for each reply to it, within 60 minutes of a C2C message and
5 minutes of a group message, at most 5 replies each. A reply past that, a handoff or
`switchboard send` is an active message, which QQ limits (or refuses: its reason is raised
as PlatformRefused). A send without a message to answer uses the chat's latest one while it
is still inside its window. Group chats are `group-<group_openid>`, guild text channels
(with `guild_messages`) `channel-<channel_id>`; a user's C2C chat is their openid. QQ has
no threads and no typing signal for bots.

QQ sends every event to the bot's session, so among replicas one receives
(gateway.shards.Receiver), resuming the session the last receiver left in the store.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Cursors,
    Emit,
    Outbound,
    Route,
    SetupSteps,
    UsesCursors,
    UsesShards,
    call_with_retry,
    failed,
    stop_task,
)
from gateway.adapters.kit.chats import NoThreads
from gateway.adapters.kit.split import split_message
from gateway.adapters.qqbot_api import (
    CHANNEL_PREFIX,
    GROUP_PREFIX,
    DuplicateSeq,
    MarkdownRefused,
    QQApi,
    ReplyGone,
    is_channel,
    is_group,
)
from gateway.adapters.qqbot_gateway import GROUP_AND_C2C_EVENT, PUBLIC_GUILD_MESSAGES, QQGateway
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    NotAccepted,
    PlatformRefused,
    TransientError,
)
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, setting
from gateway.session_keys import SessionSource
from gateway.shards import Receiver, ShardLedger
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.qqbot")
PLATFORM = "qqbot"
LIMIT = 2_000  # characters per message; longer replies are split
MAX_REPLIES = 5  # passive replies QQ takes to one message
REPLY_WINDOW_S = {ChatType.DM: 60 * 60.0, ChatType.GROUP: 5 * 60.0}
WINDOW_MARGIN_S = 15.0  # a message this close to its window's end is not replied to
SEQS = 10_000  # msg_seq counters kept (the most recent messages)
ACTIVE_HINT = (
    "QQ takes a bot's messages as replies within 60 minutes of a user's message (5 in a "
    "group); an active message needs QQ's permission and quota"
)


def _url(v: Any) -> str | None:
    ok = v is None or (isinstance(v, str) and re.match(r"^https?://[^/\s]+", v))
    return None if ok else f"must be an http:// or https:// address (got {v!r})"


@dataclass(frozen=True)
class QQBotSettings(PlatformSettings):
    app_id_env: str | None = setting(None, env_name, "env var holding the bot's AppID")
    markdown: bool = setting(False, doc="send markdown (msg_type 2); needs QQ's permission")
    token_url: str | None = setting(None, _url, "the access token service's origin")
    guild_messages: bool = setting(False, doc="also answer @-messages in guild channels")


def _received(value: Any) -> float:
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except (TypeError, ValueError):
        return time.time()


_MENTION = re.compile(r"<@!?[^>\s]+>")
ATTACHMENT_NOTE = "(an attachment: only text is read here)"


def to_inbound(kind: str, data: Mapping[str, Any]) -> InboundMessage | None:
    """A C2C_MESSAGE_CREATE, GROUP_AT_MESSAGE_CREATE or (guild) AT_MESSAGE_CREATE dispatch
    as an InboundMessage, or None (another event, no text, no ids). A group or channel
    message reaches the bot only when it @-mentions it, so it is addressed."""
    try:
        author = data.get("author") or {}
        text = str(data.get("content") or "").strip()
        msg_id = str(data["id"])
        if kind == "C2C_MESSAGE_CREATE":
            user = str(author.get("user_openid") or author.get("id") or "")
            source = SessionSource(PLATFORM, user, ChatType.DM, user) if user else None
        elif kind == "GROUP_AT_MESSAGE_CREATE":
            user = str(author.get("member_openid") or author.get("id") or "")
            group = str(data.get("group_openid") or "")
            source = (
                SessionSource(PLATFORM, GROUP_PREFIX + group, ChatType.GROUP, user)
                if user and group
                else None
            )
        elif kind == "AT_MESSAGE_CREATE":
            user = str(author.get("id") or "")
            channel = str(data.get("channel_id") or "")
            text = _MENTION.sub("", text).strip()  # the bot's <@!id> stays in a guild's text
            source = (
                SessionSource(
                    PLATFORM, CHANNEL_PREFIX + channel, ChatType.GROUP, user, author.get("username")
                )
                if user and channel
                else None
            )
        else:
            return None
        if data.get("attachments"):  # an image, a file: said, so the message is not lost
            text = f"{ATTACHMENT_NOTE} {text}".strip()
        if source is None or not text or not msg_id:
            return None
        return InboundMessage(
            source=source,
            text=text,
            platform_message_id=msg_id,
            received_at=_received(data.get("timestamp")),
            mentioned=True,
            reply_to=msg_id,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        log.info("ignored a malformed QQ message: %.200r", data)
        return None


class QQBotAdapter(NoThreads, UsesCursors, UsesShards, Outbound, SetupSteps):
    platform: ClassVar[str] = PLATFORM
    settings: ClassVar[type[QQBotSettings]] = QQBotSettings
    library_loggers: ClassVar[tuple[str, ...]] = ()  # plain aiohttp, no client library

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: QQBotSettings) -> list[SecretNeed]:
        return [
            SecretNeed("token_env", "QQBOT_CLIENT_SECRET", "the QQ bot's AppSecret"),
            SecretNeed("app_id_env", "QQBOT_APP_ID", "the QQ bot's AppID"),
        ]

    @classmethod
    def problems(cls, settings: QQBotSettings, api_enabled: bool) -> list[ConfigError]:
        why = _url(settings.base_url)
        return [ConfigError("platforms.qqbot.base_url", why)] if why else []

    @classmethod
    def from_config(cls, settings: QQBotSettings, secrets: Mapping[str, str]) -> QQBotAdapter:
        return cls(
            secrets.get("app_id_env", ""),
            secrets.get("token_env", ""),
            api_base=settings.base_url,
            token_base=settings.token_url,
            markdown=settings.markdown,
            intents=GROUP_AND_C2C_EVENT | (PUBLIC_GUILD_MESSAGES if settings.guild_messages else 0),
        )

    def routes(self) -> Mapping[str, Route]:
        return {}

    @classmethod
    def setup_steps(cls, settings: QQBotSettings) -> list[str]:
        """What to do on QQ's side (`switchboard setup` prints it)."""
        return [
            "q.qq.com: create a bot; Development > Settings shows its AppID (QQBOT_APP_ID) "
            "and AppSecret (QQBOT_CLIENT_SECRET)",
            "add this host's public IP to the IP allowlist, and in the sandbox settings add "
            "the QQ users and groups that may talk to the bot before it is published",
            "markdown: true only once QQ granted the bot native markdown messages",
        ]

    @classmethod
    async def check_credentials(
        cls, settings: QQBotSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        api = QQApi(
            secrets.get("app_id_env", ""),
            secrets.get("token_env", ""),
            settings.base_url,
            settings.token_url,
        )
        try:
            await api.access_token()
            return True, await api.whoami()
        except InvalidToken as exc:
            return False, str(exc)
        except AdapterError as exc:
            return False, f"unreachable ({type(exc.__cause__ or exc).__name__})"
        finally:
            await api.close()

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """`group-<group_openid>` and `channel-<channel_id>` are groups; anything else a
        user's openid."""
        return "group" if is_group(chat_id) or is_channel(chat_id) else "dm"

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        app_id: str,
        secret: str,
        *,
        api_base: str | None = None,
        token_base: str | None = None,
        markdown: bool = False,
        intents: int = GROUP_AND_C2C_EVENT,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self.api = QQApi(app_id, secret, api_base, token_base)
        self.markdown = markdown
        self._intents, self._backoff = intents, backoff
        self._emit: Emit | None = None
        self._cursors: Cursors | None = None
        self._gateway: QQGateway | None = None
        self._listener: asyncio.Task[None] | None = None
        self._receiver = Receiver(self.platform, self._start_listening, self._stop_listening)
        self._latest: dict[str, tuple[str, float, ChatType]] = {}  # chat -> its last message
        self._seqs: OrderedDict[str, int] = OrderedDict()  # msg_id -> the last msg_seq used
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    def use_cursors(self, cursors: Cursors) -> None:
        self._cursors = cursors

    def use_shards(self, ledger: ShardLedger) -> None:
        """Among replicas: hold the gateway connection only while this replica owns it."""
        self._receiver.use(ledger)

    async def open_outbound(self) -> None:
        """Ready to send, receiving nothing (`switchboard send` without a daemon)."""
        try:
            await call_with_retry(self.api.access_token, backoff=self._backoff, log=log)
        except InvalidToken:  # the daemon's start says so in one line naming the keys
            self.state = failed("invalid app secret")
            await self.api.close()
            raise

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        await self.open_outbound()
        await self._receiver.start()
        self.state = AdapterState.RUNNING

    async def _start_listening(self) -> None:
        self._gateway = QQGateway(
            self.api,
            self._on_event,
            intents=self._intents,
            backoff=self._backoff,
            cursors=self._cursors,
        )
        await self._gateway.load()
        self._listener = asyncio.create_task(self._listen(self._gateway), name="qqbot.gateway")

    async def _listen(self, gateway: QQGateway) -> None:
        try:
            await gateway.run()
        except InvalidToken as exc:
            self.state, self.last_error = failed("gateway refused"), str(exc)
            log.error("%s; the adapter is stopped", exc)

    async def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        await stop_task(listener)

    async def stop(self) -> None:
        self._emit = None
        await self._receiver.stop()
        await self._stop_listening()
        await self.api.close()
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        gw = self._gateway
        return {
            "state": self.state,
            "connected": bool(gw and gw.connected and self._receiver.receiving),
            "connections": gw.connections if gw else 0,
            "bot": gw.bot_name if gw else None,
            "last_error": self.last_error or (gw.last_error if gw else None),
            **self._receiver.health(),
        }

    @property
    def gateway(self) -> QQGateway | None:
        return self._gateway

    # --- inbound ------------------------------------------------------------------------

    async def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        """A dispatch: a message goes to the core (raising NotAccepted when it could not be
        stored, so the sequence number stays before it); other events are passed over."""
        msg = to_inbound(kind, data)
        if msg is None:
            return
        if self._emit is None:
            raise NotAccepted("the adapter is stopping", "shutting_down")
        await self._emit(msg)
        self._latest[msg.source.chat_id] = (
            str(msg.platform_message_id),
            time.monotonic(),
            msg.source.chat_type,
        )

    # --- sending --------------------------------------------------------------------------

    def _answerable(self, chat_id: str) -> str | None:
        """The chat's latest message while a reply to it can still go (inside its window)."""
        found = self._latest.get(chat_id)
        if found is None:
            return None
        msg_id, at, kind = found
        if time.monotonic() - at > REPLY_WINDOW_S[kind] - WINDOW_MARGIN_S:
            return None
        return msg_id if self._seqs.get(msg_id, 0) < MAX_REPLIES else None

    def _next_seq(self, msg_id: str) -> int:
        seq = self._seqs.pop(msg_id, 0) + 1
        self._seqs[msg_id] = seq
        while len(self._seqs) > SEQS:
            self._seqs.popitem(last=False)
        return seq

    def _body(self, chat_id: str, text: str) -> dict[str, Any]:
        if is_channel(chat_id):  # a guild channel's message has no msg_type
            return {"markdown": {"content": text}} if self.markdown else {"content": text}
        if self.markdown:
            return {"msg_type": 2, "markdown": {"content": text}}
        return {"msg_type": 0, "content": text}

    async def _send_part(self, chat_id: str, text: str, reply_to: str | None) -> str:
        """One part: a passive reply to `reply_to` while QQ takes one (a fresh msg_seq for
        each part), else an active message. A retry QQ calls a duplicate of an attempt that
        got no answer went through the first time."""
        msg_id = reply_to
        numbered = not is_channel(chat_id)  # a guild channel's reply names only msg_id
        seq = self._next_seq(msg_id) if msg_id and numbered else 0
        if seq > MAX_REPLIES:
            msg_id = None
        unanswered: set[int] = set()  # msg_seqs tried without an answer

        async def once() -> str:
            nonlocal msg_id, seq
            body = self._body(chat_id, text)
            if msg_id:
                body["msg_id"] = msg_id
                if numbered:
                    body["msg_seq"] = seq
            try:
                return await self.api.send(chat_id, body)
            except DuplicateSeq:
                if seq in unanswered:
                    return ""  # the earlier attempt was taken
                seq = self._next_seq(str(msg_id))  # another sender used this one
                raise TransientError("msg_seq taken; the next one") from None
            except MarkdownRefused as exc:
                if self.markdown:
                    self.markdown = False
                    log.warning(
                        "qq refuses this bot's markdown (%s); sending plain text from now on "
                        "(set platforms.qqbot.markdown: false)",
                        exc,
                    )
                raise TransientError("markdown refused; as text") from None
            except ReplyGone as exc:
                log.info("qq: %s is past replying to (%s); sending actively", msg_id, exc)
                msg_id = None
                raise TransientError("the message is past replying to") from None
            except TransientError:
                unanswered.add(seq)
                raise
            except PlatformRefused as exc:
                if msg_id is None:
                    raise PlatformRefused(f"{exc}; {ACTIVE_HINT}") from exc
                raise

        return await call_with_retry(once, backoff=self._backoff, log=log)

    async def send(self, msg: OutboundMessage) -> SentRef:
        """Each part of the text as a reply to the message it answers (or to the chat's
        latest message while it can be answered), else actively."""
        reply_to = msg.reply_to or self._answerable(msg.chat_id)
        ids = []
        for part in split_message(msg.text, LIMIT):
            try:
                sent = await self._send_part(msg.chat_id, part, reply_to)
            except (AdapterError, PlatformRefused) as exc:
                self.last_error = str(exc)
                raise
            if sent:
                ids.append(sent)
        return SentRef(self.platform, msg.chat_id, tuple(ids))
