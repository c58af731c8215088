"""Weixin (personal WeChat) through Tencent's iLink Bot API (weixin_api): a `getupdates` long
poll in, `sendmessage` out, the bot token from `switchboard login weixin` (weixin_login).

Inbox before ack: the poll's cursor (`get_updates_buf`) is kept in the store and moved past
a batch only once `emit` returned for each of its messages; a message the gateway could not
take leaves it where it was, so the next poll delivers the batch again (the core answers a
redelivery once). Every reply must echo the chat's latest `context_token`: the adapter
keeps each chat's in the store too (a cursor named `ctx:<chat id>`), written before the
message is handed over, so a reply after a restart, from another replica, a `/handoff` or
`switchboard send` (with or without the daemon: `cursors_to_send`) reaches a user who
wrote before; a user who never
wrote has no token, and such a send is refused with a clear error. iLink delivers 1:1 chats;
a message that names a group is taken as not addressed to the bot unless require_mention is
off (iLink marks no mentions).
Among replicas one polls (gateway.shards.Receiver) and any replica sends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Cursors,
    Emit,
    Login,
    LoginResult,
    Outbound,
    Route,
    SetupSteps,
    Typing,
    UsesCursors,
    UsesShards,
    call_with_retry,
    failed,
    stop_task,
)
from gateway.adapters.kit.chats import DirectOnly
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.typing import TypingLoops
from gateway.adapters.weixin_api import BOT_MESSAGE, ITEM_TEXT, ITEM_VOICE, WeixinApi
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    NotAccepted,
    PlatformRefused,
    RetryAfter,
    TransientError,
)
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.sections import PlatformSettings, SecretNeed, in_range, setting
from gateway.session_keys import SessionSource
from gateway.shards import Receiver, ShardLedger
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.weixin")
PLATFORM = "weixin"
LIMIT = 2_000  # characters per text message (iLink cuts longer ones at about 2,048)
CURSOR = "get_updates_buf"
CONTEXT = "ctx:{}"  # the cursor holding a chat's latest context_token
TYPING_EVERY_S = 5.0  # a Weixin typing indicator is renewed this often while a turn runs
TICKET_FOR_S = 600.0  # a typing ticket is asked for again after this long


@dataclass(frozen=True)
class WeixinSettings(PlatformSettings):
    poll_timeout_seconds: float = setting(
        40.0,
        in_range(5, 300),
        "how long one getupdates long poll may take (iLink holds it about 35 s)",
    )


VOICE_NOTE = "[a voice message, as WeChat transcribed it]"


def message_text(items: Any) -> str | None:
    """The text of a message's item_list: its text items, joined; else the transcript
    WeChat made of a voice message, marked as one; None without either."""
    if not isinstance(items, list):
        return None
    kept = [item for item in items if isinstance(item, dict)]
    parts = [
        str((item.get("text_item") or {}).get("text") or "").strip()
        for item in kept
        if item.get("type") == ITEM_TEXT
    ]
    if any(parts):
        return "\n".join(p for p in parts if p)
    voice = [
        str((item.get("voice_item") or {}).get("text") or "").strip()
        for item in kept
        if item.get("type") == ITEM_VOICE
    ]
    said = " ".join(v for v in voice if v)
    return f"{VOICE_NOTE}\n{said}" if said else None


def to_inbound(msg: Mapping[str, Any], require_mention: bool = True) -> InboundMessage | None:
    """A getupdates message as an InboundMessage; None for the bot's own messages, those
    without text, a sender or an id. A message naming a group (`group_id`) is a group
    message, addressed to the bot only with require_mention off (iLink gives no mention)."""
    try:
        if msg.get("message_type") == BOT_MESSAGE:
            return None
        sender, msg_id = str(msg.get("from_user_id") or ""), msg.get("message_id")
        text = (message_text(msg.get("item_list")) or "").strip()
        if not sender or msg_id in (None, "") or not text:
            return None
        group = str(msg.get("group_id") or "")
        if group:
            source = SessionSource(PLATFORM, group, ChatType.GROUP, sender)
        else:
            source = SessionSource(PLATFORM, sender, ChatType.DM, sender)
        return InboundMessage(
            source=source,
            text=text,
            platform_message_id=str(msg_id),
            received_at=int(msg.get("create_time_ms") or 0) / 1000,
            mentioned=not group or not require_mention,
        )
    except (TypeError, ValueError, AttributeError):
        log.info("ignored a malformed Weixin message: %.200r", msg)
        return None


class WeixinAdapter(DirectOnly, Typing, UsesCursors, UsesShards, Outbound, SetupSteps, Login):
    """iLink delivers 1:1 chats: a home channel is a user. Weixin has no threads: a handoff
    lands in the home chat itself."""

    platform: ClassVar[str] = PLATFORM
    settings: ClassVar[type[WeixinSettings]] = WeixinSettings
    library_loggers: ClassVar[tuple[str, ...]] = ()
    cursors_to_send: ClassVar[bool] = True  # the chats' context tokens are in the store

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: WeixinSettings) -> list[SecretNeed]:
        return [
            SecretNeed(
                "token_env", "WEIXIN_TOKEN", "the bot token `switchboard login weixin` stores"
            )
        ]

    @classmethod
    def problems(cls, settings: WeixinSettings, api_enabled: bool) -> list[ConfigError]:
        return []

    @classmethod
    def from_config(cls, settings: WeixinSettings, secrets: Mapping[str, str]) -> WeixinAdapter:
        return cls(
            secrets.get("token_env", ""),
            base_url=settings.base_url,
            require_mention=settings.require_mention,
            poll_timeout_s=settings.poll_timeout_seconds,
        )

    def routes(self) -> Mapping[str, Route]:
        return {}

    @classmethod
    async def check_credentials(
        cls, settings: WeixinSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        api = WeixinApi(secrets.get("token_env", ""), settings.base_url)
        try:
            await api.check_token()
        except (TransientError, RetryAfter) as exc:
            return False, f"unreachable ({type(exc.__cause__ or exc).__name__})"
        except AdapterError as exc:  # InvalidToken included
            return False, str(exc)
        finally:
            await api.close()
        return True, f"bot token accepted by {api.base}"

    @classmethod
    def setup_steps(cls, settings: WeixinSettings) -> list[str]:
        return [
            "run `switchboard login weixin` and scan the QR code it prints with WeChat, then "
            "confirm on the phone: it stores the bot token in the secrets file and the base "
            "URL in config.yaml",
            "the bot answers a user only after that user wrote to it (each reply echoes the "
            "user's latest context_token)",
        ]

    @classmethod
    async def login(
        cls, settings: WeixinSettings, base_url: str | None, timeout_s: float, out: Any
    ) -> LoginResult:
        """The QR login (weixin_login): the bot token, and the base URL iLink gave."""
        from gateway.adapters.weixin_api import DEFAULT_BASE_URL
        from gateway.adapters.weixin_login import qr_login

        got = await qr_login(base_url or settings.base_url or DEFAULT_BASE_URL, timeout_s, out)
        return LoginResult(
            secrets={"token_env": got["token"]},
            settings={"base_url": got["base_url"]},
            notes=[
                f"logged in as {got['bot_id'] or 'the bot'}; scanned by WeChat user "
                f"{got['user_id'] or '?'} (add it to platforms.weixin.allowed_users to let "
                "them talk to the bot)"
            ],
        )

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        token: str,
        *,
        base_url: str | None = None,
        require_mention: bool = True,
        poll_timeout_s: float = 40.0,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self.api = WeixinApi(token, base_url)
        self._require_mention = require_mention
        self._poll_timeout = poll_timeout_s
        self._backoff = backoff
        self._cursors: Cursors | None = None
        self._contexts: dict[str, str] = {}  # chat -> latest context_token, without a store
        self._cursor = ""
        self._emit: Emit | None = None
        self._poller: asyncio.Task[None] | None = None
        self._receiver = Receiver(PLATFORM, self._start_polling, self._stop_polling)
        self._tickets: dict[str, tuple[str, float]] = {}  # peer -> (typing ticket, got at)
        self._typing = TypingLoops(
            "weixin.typing", self._typing_on, every_s=TYPING_EVERY_S, withdraw=self._typing_off
        )
        self.polls = 0
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    def use_cursors(self, cursors: Cursors) -> None:
        self._cursors = cursors

    def use_shards(self, ledger: ShardLedger) -> None:
        """Among replicas: poll only while this replica owns the receiving connection."""
        self._receiver.use(ledger)

    async def open_outbound(self) -> None:
        """Ready to send, polling nothing (`switchboard send` without a daemon): the token
        checked; the chats' context tokens come from the store's cursors."""
        try:
            await self.api.check_token()
        except AdapterError:
            await self.api.close()
            raise

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        try:
            await call_with_retry(self.api.check_token, backoff=self._backoff, attempts=2, log=log)
        except InvalidToken:  # the daemon's start logs it, naming token_env
            self.state = failed("invalid bot token")
            await self.api.close()
            raise
        await self._receiver.start()
        self.state = AdapterState.RUNNING
        log.info(
            "weixin at %s (%s)",
            self.api.base,
            "polling" if self._receiver.receiving else "sending only",
        )

    async def stop(self) -> None:
        await self._receiver.stop()
        await self._stop_polling()
        await self._typing.close()
        self._emit = None
        await self.api.close()
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "polls": self.polls,
            "last_error": self.last_error,
            **self._receiver.health(),
        }

    # --- inbound: the long poll -----------------------------------------------------------

    async def _start_polling(self) -> None:
        """From the stored cursor: after a restart or a takeover, where the last poll left it."""
        if self._cursors is not None:
            self._cursor = await self._cursors.get(CURSOR) or ""
        self._poller = asyncio.create_task(self._poll(), name="weixin.poll")

    async def _stop_polling(self) -> None:
        poller, self._poller = self._poller, None
        await stop_task(poller)  # a poll cut short moved nothing: it is asked again

    async def _poll(self) -> None:
        failures, timeout = 0, self._poll_timeout
        while True:
            try:
                got = await self.api.get_updates(self._cursor, timeout)
                self.polls += 1
                if got.next_timeout_s:
                    timeout = max(self._poll_timeout, got.next_timeout_s + 5)
                for raw in got.msgs:
                    await self._hand_over(raw)
                if got.cursor != self._cursor:
                    self._cursor = got.cursor
                    if self._cursors is not None:
                        await self._cursors.set(CURSOR, got.cursor)
                failures = 0
                continue
            except InvalidToken as exc:
                self.state, self.last_error = failed("bot token refused"), str(exc)
                log.error(
                    "platforms.weixin.token_env: %s; weixin polling stopped (the rest of the "
                    "gateway runs)",
                    exc,
                )
                return
            except NotAccepted as exc:
                self.last_error = f"a message was not accepted: {exc}"
                log.warning("weixin: the gateway could not take a message; polling it again")
            except AdapterError as exc:  # RetryAfter, TransientError, an odd answer
                self.last_error = f"getupdates: {exc}"
                log.warning("weixin polling error (retrying): %s", exc)
            except Exception as exc:  # the store refused the cursor, say: keep polling
                self.last_error = f"getupdates: {type(exc).__name__}: {exc}"
                log.exception("weixin polling failed; polling again")
            await asyncio.sleep(self._backoff.delay(failures))
            failures += 1

    async def _hand_over(self, raw: Mapping[str, Any]) -> None:
        if self._emit is None:
            raise NotAccepted("the weixin adapter is stopping", "shutting_down")
        msg = to_inbound(raw, self._require_mention)
        if msg is None:
            return
        token = raw.get("context_token")
        if token and isinstance(token, str):
            await self._remember(msg.source.chat_id, token)
        await self._emit(msg)  # NotAccepted leaves the cursor where it was

    async def _remember(self, chat: str, token: str) -> None:
        if self._cursors is not None:
            await self._cursors.set(CONTEXT.format(chat), token)
        else:
            self._contexts[chat] = token

    async def _context_of(self, chat: str) -> str | None:
        if self._cursors is not None:
            return await self._cursors.get(CONTEXT.format(chat))
        return self._contexts.get(chat)

    # --- typing: a ticket per peer from getconfig, then sendtyping ---------------------------

    def turn_started(self, msg: InboundMessage) -> None:
        if msg.source.chat_type == ChatType.DM:
            self._typing.start(msg.source.chat_id)

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        self._typing.stop(msg.source.chat_id)

    async def _ticket(self, peer: str) -> str | None:
        found = self._tickets.get(peer)
        if found and time.monotonic() - found[1] < TICKET_FOR_S:
            return found[0]
        token = await self._context_of(peer)
        ticket = await self.api.typing_ticket(peer, token) if token else None
        if ticket:
            self._tickets[peer] = (ticket, time.monotonic())
        return ticket

    async def _typing_on(self, peer: str) -> None:
        ticket = await self._ticket(peer)
        if ticket:
            await self.api.send_typing(peer, ticket, on=True)

    async def _typing_off(self, peer: str) -> None:
        found = self._tickets.get(peer)
        if found:
            await self.api.send_typing(peer, found[0], on=False)

    # --- sending --------------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> SentRef:
        """Each part (split under LIMIT) through sendmessage with the peer's context_token."""
        self._typing.stop(msg.chat_id)
        token = await self._context_of(msg.chat_id)
        if not token:
            raise PlatformRefused(
                f"weixin cannot message {msg.chat_id}: that user has not written to the bot "
                "(a Weixin reply needs the context_token of the user's latest message)"
            )
        ids = []
        for part in split_message(msg.text, LIMIT):
            try:
                sent = await call_with_retry(
                    lambda p=part: self.api.send_text(msg.chat_id, p, token),  # type: ignore[misc]
                    backoff=self._backoff,
                    log=log,
                )
            except (InvalidToken, TransientError, RetryAfter):
                raise
            except AdapterError as exc:
                self.last_error = str(exc)
                raise PlatformRefused(
                    f"{exc} (when the user's context_token has grown too old for iLink, "
                    "the user has to write to the bot again)"
                ) from exc
            ids.append(sent)
        return SentRef(self.platform, msg.chat_id, tuple(ids))
