"""Telegram, on python-telegram-bot 22 (polling by default; webhook optional).

`to_inbound` is a pure function over the raw update dict, so recorded payloads (and
malformed ones) can be tested without a network. The adapter only translates: it knows no
session keys, no SQL, no policies. An update is acknowledged to Telegram (the webhook's 200,
the next getUpdates offset) only after `emit` returned for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Emit,
    Outbound,
    ReplicaLimits,
    RetryAfter,
    Route,
    SetupSteps,
    TransientError,
    Typing,
    call_with_retry,
    failed,
)
from gateway.adapters.kit.chats import OpensThreads
from gateway.adapters.kit.lifecycle import refused
from gateway.adapters.kit.split import split_message, utf16_len
from gateway.adapters.kit.typing import TypingLoops
from gateway.adapters.kit.webhook import api_server_off
from gateway.adapters.telegram_polling import POLL_READ_S, Poller, retry_after_s
from gateway.errors import ConfigError, InvalidToken, NotAccepted, PlatformRefused
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, platform_mode, setting
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.telegram")
LIMIT = 4096  # UTF-16 code units per message
TYPING_EVERY_S = 4.0
# Bot API calls in flight at once, below python-telegram-bot's pool of 256 connections:
# more would queue inside httpcore, whose pool hands out connections by scanning every
# waiting request (quadratic in a backlog) and fails a wait longer than 1 s, which the
# retries then multiply. Waiting here is a plain FIFO.
CALLS_IN_FLIGHT = 64
# A turn answered sooner than this shows no typing: the reply itself is the sign of life,
# and an action per quick turn would double the requests to the Bot API under load.
TYPING_AFTER_S = 0.3
DEFAULT_API = "https://api.telegram.org/bot"
WEBHOOK_PATH = "/telegram/webhook"
# A reply goes out through Bot.do_api_request, which answers with the Bot API's JSON rather
# than a Message: the adapter keeps only the message_id, and building the Message (its chat,
# its sender, each frozen) was a fifth of the daemon's instructions per Telegram message
# (docs/benchmarks.md). getUpdates is read the same way (telegram_polling.py). The library
# warns at every such call that a method of its own exists; the adapter silences that
# warning for its own calls when it starts.
RAW_CALL_WARNING = r"Please use 'Bot\.(sendMessage|getUpdates)'"


@dataclass(frozen=True)
class TelegramSettings(PlatformSettings):
    mode: str | None = setting("polling", platform_mode("telegram", "polling", "webhook"))
    webhook_url: str | None = setting(None)
    webhook_secret_env: str | None = setting(None, env_name, "Telegram webhook secret env var")


def to_inbound(
    update: Mapping[str, Any], bot_username: str | None, require_mention: bool = True
) -> InboundMessage | None:
    """An update as an InboundMessage, or None for anything that is not a new text message
    from a person (edits, joins, bots, malformed payloads)."""
    try:
        kind = (
            "message"
            if "message" in update
            else "channel_post"
            if "channel_post" in update
            else None
        )
        if kind is None:
            return None
        msg = update[kind]
        chat = msg["chat"]
        text = msg.get("text") or msg.get("caption")
        if not isinstance(text, str) or not text.strip():
            return None
        sender = msg.get("from") or {}
        if sender.get("is_bot"):
            return None
        ctype = {
            "private": ChatType.DM,
            "group": ChatType.GROUP,
            "supergroup": ChatType.GROUP,
            "channel": ChatType.CHANNEL,
        }.get(chat.get("type"))
        if ctype is None:
            return None
        # A forum topic is a thread; the General topic and ordinary reply chains are not.
        thread = msg.get("message_thread_id") if msg.get("is_topic_message") else None
        user_id = sender.get("id")
        name = " ".join(
            p for p in (sender.get("first_name"), sender.get("last_name")) if p
        ) or sender.get("username")
        source = SessionSource(
            platform="telegram",
            chat_id=str(chat["id"]),
            chat_type=ctype,
            user_id=None if user_id is None else str(user_id),
            user_name=name or None,
            chat_name=chat.get("title") or None,
            thread_id=None if thread is None else str(thread),
        )
        mentioned = True
        if ctype != ChatType.DM and require_mention:
            mentioned = _addressed(msg, text, bot_username)
        return InboundMessage(
            source=source,
            text=_strip_mention(text, bot_username),
            platform_message_id=str(msg["message_id"]),
            received_at=float(msg.get("date") or time.time()),
            mentioned=mentioned,
            reply_to=str(msg["message_id"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        log.info("ignored a malformed Telegram update: %.200r", update)
        return None


def _addressed(msg: Mapping[str, Any], text: str, bot_username: str | None) -> bool:
    if text.startswith("/"):
        return True  # commands are for bots
    if bot_username and f"@{bot_username}".lower() in text.lower():
        return True
    replied = (msg.get("reply_to_message") or {}).get("from") or {}
    return bool(bot_username and replied.get("username") == bot_username)


def _strip_mention(text: str, bot_username: str | None) -> str:
    if not bot_username:
        return text
    tag = f"@{bot_username}"
    first, _, rest = text.partition(" ")
    if first.lower() == tag.lower():
        return rest.strip() or text
    if first.startswith("/") and first.lower().endswith(tag.lower()):
        return first[: -len(tag)] + (" " + rest if rest else "")
    return text


class TelegramAdapter(OpensThreads, Typing, Outbound, SetupSteps, ReplicaLimits):
    platform: ClassVar[str] = "telegram"
    # a forum topic is a thread of its group
    thread_chat_type: ClassVar[ChatType] = ChatType.GROUP
    settings: ClassVar[type[TelegramSettings]] = TelegramSettings
    drain_per_second: ClassVar[float] = (
        25.0  # the outbox's backlog pace (Telegram: about 30 a second across chats)
    )
    library_loggers: ClassVar[tuple[str, ...]] = ("telegram",)

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: TelegramSettings) -> list[SecretNeed]:
        needs = [SecretNeed("token_env", "TELEGRAM_BOT_TOKEN", "the telegram bot token")]
        if settings.mode == "webhook":
            needs.append(
                SecretNeed("webhook_secret_env", "TELEGRAM_WEBHOOK_SECRET", "webhook secret")
            )
        return needs

    @classmethod
    def problems(cls, settings: TelegramSettings, api_enabled: bool) -> list[ConfigError]:
        out = []
        if settings.mode == "webhook":
            out += api_server_off(cls.platform, api_enabled, key="mode")
            if not settings.webhook_url:
                out.append(
                    ConfigError("platforms.telegram.webhook_url", "is required in webhook mode")
                )
        return out

    @classmethod
    def replica_problems(cls, settings: TelegramSettings, replicas: int) -> list[ConfigError]:
        """Several replicas cannot share polling: Telegram answers a second getUpdates
        caller with 409 Conflict, and each would ack the other's offset."""
        if settings.mode != "polling":
            return []
        return [
            ConfigError(
                "platforms.telegram.mode",
                f"polling cannot be shared by {replicas} replicas (cluster.replicas): Telegram "
                "allows one getUpdates poller per bot; use mode: webhook behind the load balancer",
            )
        ]

    @classmethod
    def from_config(cls, settings: TelegramSettings, secrets: Mapping[str, str]) -> TelegramAdapter:
        webhook = settings.mode == "webhook"
        return cls(
            secrets.get("token_env", ""),
            base_url=settings.base_url,
            require_mention=settings.require_mention,
            webhook_url=settings.webhook_url if webhook else None,
            webhook_secret=secrets.get("webhook_secret_env") if webhook else None,
        )

    def routes(self) -> Mapping[str, Route]:
        return {WEBHOOK_PATH: self.handle_webhook} if self._webhook_url else {}

    @classmethod
    def setup_steps(cls, settings: TelegramSettings) -> list[str]:
        """What to do on Telegram's side (`switchboard setup` prints it)."""
        steps = [
            "BotFather: /newbot gives the token; /setprivacy -> Disable lets the bot "
            "read group messages that do not mention it (require_mention: false)"
        ]
        if settings.mode == "webhook":
            steps.append(
                "webhook mode: the daemon registers webhook_url with Telegram at "
                "start; it must reach /telegram/webhook on the api server"
            )
        return steps

    @classmethod
    async def check_credentials(
        cls, settings: TelegramSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        from telegram import Bot
        from telegram import error as tg_error

        from gateway.adapters.telegram_request import AiohttpRequest

        # one request object, closed here: Bot.shutdown() skips a bot never initialize()d
        request = AiohttpRequest(connect_timeout=5, read_timeout=10, pool_size=1)
        base_url = (settings.base_url or DEFAULT_API).rstrip("/")
        bot = Bot(
            secrets.get("token_env", ""),
            base_url=base_url,
            request=request,
            get_updates_request=request,
        )
        try:
            await request.initialize()
            me = await bot.get_me()
        except tg_error.InvalidToken as exc:  # PTB's name for a 401 from getMe
            return False, exc.message
        except tg_error.TelegramError as exc:
            return False, f"unreachable ({type(exc).__name__})"
        finally:
            await request.shutdown()
        return True, f"@{me.username}"

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """A user id (positive) is the bot's DM with that user; groups are negative."""
        return "dm" if chat_id.isdigit() else "group"

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        token: str,
        *,
        base_url: str | None = None,
        require_mention: bool = True,
        poll_timeout_s: float = 30.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
    ) -> None:
        # webhook mode: Telegram POSTs updates to the daemon's HTTP server (handle_webhook)
        self._webhook_url = webhook_url
        self._webhook_secret = webhook_secret
        self._token = token
        self._base_url = base_url
        self._require_mention = require_mention
        self._poll_timeout = poll_timeout_s
        self._backoff = backoff
        self._bot: Any = None
        self._poller: Poller | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self._emit: Emit | None = None
        self._typing: TypingLoops[tuple[str, str | None]] = TypingLoops(
            "telegram.typing", self._show_typing, every_s=TYPING_EVERY_S, after_s=TYPING_AFTER_S
        )
        self._calls = asyncio.Semaphore(CALLS_IN_FLIGHT)
        self.bot_username: str | None = None
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    # --- lifecycle --------------------------------------------------------------------

    async def open_outbound(self) -> None:
        """Ready to send, receiving nothing (`switchboard send` without a daemon): the bot
        and its getMe, neither polling nor touching the webhook."""
        from telegram import Bot
        from telegram import error as tg_error

        from gateway.adapters.telegram_request import AiohttpRequest

        base = (self._base_url or DEFAULT_API).rstrip("/")
        warnings.filterwarnings("ignore", RAW_CALL_WARNING, module=r"gateway\.adapters\.telegram")
        self._bot = Bot(
            self._token,
            base_url=base,
            base_file_url=base.replace("/bot", "/file/bot"),
            request=AiohttpRequest(connect_timeout=5, read_timeout=20, pool_size=CALLS_IN_FLIGHT),
            get_updates_request=AiohttpRequest(
                connect_timeout=5, read_timeout=POLL_READ_S, pool_size=1
            ),
        )
        try:
            await self._bot.initialize()  # getMe
        except tg_error.InvalidToken as exc:
            error = refused(self, exc, by="telegram", credential="bot token", log=log)
            await self._close_bot()
            raise error from exc
        except tg_error.NetworkError as exc:  # unreachable, timed out, a 5xx: worth retrying
            await self._close_bot()
            raise TransientError(f"telegram is unreachable ({exc})") from exc
        self.bot_username = self._bot.username

    async def start(self, emit: Emit) -> None:
        from telegram import Update

        self._emit = emit
        await self.open_outbound()
        if self._webhook_url:
            await self._call(
                lambda: self._bot.set_webhook(
                    url=self._webhook_url,
                    secret_token=self._webhook_secret,
                    allowed_updates=Update.ALL_TYPES,
                )
            )
        else:
            # polling and a webhook exclude each other; pending updates are kept
            await self._call(lambda: self._bot.delete_webhook(drop_pending_updates=False))
            self._poller = Poller(
                self._bot, self._take, timeout_s=self._poll_timeout, backoff=self._backoff
            )
            self._poll_task = asyncio.create_task(self._poll(), name="telegram.poll")
        self.state = AdapterState.RUNNING
        log.info(
            "telegram %s as @%s", "webhook" if self._webhook_url else "polling", self.bot_username
        )

    async def _poll(self) -> None:
        assert self._poller is not None
        try:
            await self._poller.run()
        except Exception as exc:  # a bug, not the network (that is retried inside)
            log.exception("telegram polling stopped")
            self.state = failed(type(exc).__name__)
            return
        if self._poller.stopped_by:  # the loop gives up only on a token Telegram refused
            self.state = failed(self._poller.stopped_by)

    async def handle_webhook(self, request: Any) -> Any:
        """POST /telegram/webhook on the daemon's HTTP server. Telegram sends the secret
        set with setWebhook in a header; anything else is refused with 403. The 200 goes
        out only after `emit` returned; a message the gateway could not take is a 503, so
        Telegram delivers it again."""
        import hmac

        from aiohttp import web

        given = request.headers.get("X-Telegram-Bot-Api-Secret-Token", "")
        if not self._webhook_secret or not hmac.compare_digest(
            given.encode(), self._webhook_secret.encode()
        ):
            return web.Response(status=403, text="forbidden")
        if self._bot is None or self.state != AdapterState.RUNNING:
            return web.Response(status=503, text="not running")
        # The update is read as the dict it is (to_inbound checks every field it uses and
        # ignores what it cannot read), not through python-telegram-bot's objects and back:
        # that round trip was about an eighth of the event loop at 500 updates/s.
        try:
            data = await request.json()
        except ValueError:
            return web.Response(status=400, text="not a Telegram update")
        if not isinstance(data, dict) or type(data.get("update_id")) is not int:
            return web.Response(status=400, text="not a Telegram update")
        update_id = data["update_id"]
        try:
            await self._take(data)
        except NotAccepted as exc:
            log.warning("telegram update %s not accepted (Telegram will retry): %s", update_id, exc)
            return web.Response(status=503, text="not accepted, retry")
        except Exception:
            log.exception("telegram update %s failed (Telegram will retry)", update_id)
            return web.Response(status=503, text="not accepted, retry")
        return web.Response(status=200, text="ok")

    async def stop(self) -> None:
        await self._typing.close()
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._poll_task
            self._poll_task = None
            if self._poller is not None:
                await self._poller.confirm()
        # a webhook stays set while we are down: Telegram keeps the updates for us
        await self._close_bot()
        self.state = AdapterState.STOPPED

    async def _close_bot(self) -> None:
        if self._bot is not None:
            with contextlib.suppress(Exception):
                await self._bot.shutdown()
            self._bot = None

    def health(self) -> dict[str, object]:
        out: dict[str, object] = {
            "state": self.state,
            "bot": self.bot_username,
            "last_error": self.last_error,
        }
        if self._poller is not None:
            out["offset"] = self._poller.offset
            out["last_error"] = self._poller.last_error or self.last_error
        return out

    # --- inbound ------------------------------------------------------------------------

    async def _take(self, update: dict[str, Any]) -> None:
        """Hand one update to the gateway; returns once it is committed (or not for us)."""
        msg = to_inbound(update, self.bot_username, self._require_mention)
        if msg is None or self._emit is None:
            return
        await self._emit(msg)

    # Typing shows only for a turn the router runs (not for a duplicate or a refused user),
    # and stops with the reply or when the router is done with the message, whatever the end.
    def turn_started(self, msg: InboundMessage) -> None:
        self._typing.start((msg.source.chat_id, msg.source.thread_id))

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        self._typing.stop((msg.source.chat_id, msg.source.thread_id))

    async def _show_typing(self, where: tuple[str, str | None]) -> None:
        chat_id, thread_id = where
        async with self._calls:
            await self._bot.send_chat_action(
                chat_id=int(chat_id),
                action="typing",
                message_thread_id=int(thread_id) if thread_id else None,
            )

    # --- outbound -----------------------------------------------------------------------

    async def _call(self, fn: Any) -> Any:
        from telegram import error as tg_error

        async def attempt() -> Any:
            try:
                async with self._calls:
                    return await fn()
            except tg_error.RetryAfter as exc:
                raise RetryAfter(retry_after_s(exc)) from exc
            except (tg_error.InvalidToken, tg_error.EndPointNotFound) as exc:
                # once getMe has worked, do_api_request reports a rejected token as EndPointNotFound
                raise InvalidToken(str(exc)) from exc
            except (tg_error.TimedOut, tg_error.NetworkError) as exc:
                if isinstance(exc, tg_error.BadRequest):
                    raise
                # a SetOutLate PTB wrapped comes out of call_with_retry as itself
                raise TransientError(str(exc)) from exc

        return await call_with_retry(attempt, backoff=self._backoff, log=log)

    async def send(self, msg: OutboundMessage) -> SentRef:
        from telegram import error as tg_error

        self._typing.stop((msg.chat_id, msg.thread_id))
        ids: list[str] = []
        thread = int(msg.thread_id) if msg.thread_id else None  # None: left out of the call
        where = {"chat_id": int(msg.chat_id), "message_thread_id": thread}
        for part in split_message(msg.text, LIMIT, utf16_len):
            try:
                sent = await self._call(
                    lambda part=part: self._bot.do_api_request(
                        "sendMessage", api_kwargs={**where, "text": part}
                    )
                )
            except tg_error.TelegramError as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                raise PlatformRefused(f"telegram refused the message: {exc}") from exc
            ids.append(str(sent["message_id"]))
        return SentRef(self.platform, msg.chat_id, tuple(ids))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """A forum topic; None when the chat is not a forum."""
        from telegram import error as tg_error

        try:
            topic = await self._call(
                lambda: self._bot.create_forum_topic(chat_id=int(chat_id), name=name[:128])
            )
        except tg_error.BadRequest as exc:
            log.info("no forum topic in chat %s: %s", chat_id, exc)
            return None
        return ThreadRef(self.platform, chat_id, str(topic.message_thread_id), name)
