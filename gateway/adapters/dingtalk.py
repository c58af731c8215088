"""DingTalk, on dingtalk-stream (Stream mode: an outbound websocket, no public endpoint).

Robot messages arrive as CALLBACK frames on `/v1.0/im/bot/messages/get`; the library's
router awaits our handler and only then sends the ack frame, so a message is acked after
`emit` returned (a 500 ack when it could not be stored, and DingTalk delivers it again).
The connection loop is ours (the library's `start` blocks the event loop on `requests` and
swallows cancellation); replies go through the message's session webhook while it is valid,
else the robot API (dingtalk_api). DingTalk has no threads and no typing signal.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any, ClassVar

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
from gateway.adapters.dingtalk_api import DingTalkApi
from gateway.adapters.kit.chats import NoThreads
from gateway.adapters.kit.split import split_message
from gateway.errors import AdapterError, ConfigError, InvalidToken, NotAccepted, TransientError
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, setting
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.dingtalk")
PLATFORM = "dingtalk"
TOPIC = "/v1.0/im/bot/messages/get"
LIMIT = 5_000  # characters of markdown per message (a conservative reading of DingTalk's limits)
WEBHOOK_MARGIN_MS = 60_000  # a session webhook this close to expiry is not used


@dataclass(frozen=True)
class DingTalkSettings(PlatformSettings):
    client_id_env: str | None = setting(None, env_name, "DingTalk Client ID (AppKey) env var")
    robot_code: str | None = setting(None, doc="the robot's code; defaults to the Client ID")


def message_text(data: Mapping[str, Any]) -> str | None:
    """The text of a robot message (text, or the text parts of richText); None otherwise."""
    kind = data.get("msgtype")
    if kind == "text":
        return str((data.get("text") or {}).get("content") or "").strip()
    if kind == "richText":
        parts = (data.get("content") or {}).get("richText") or []
        return "".join(str(p["text"]) for p in parts if isinstance(p, dict) and "text" in p).strip()
    return None


def to_inbound(data: Mapping[str, Any], require_mention: bool = True) -> InboundMessage | None:
    """A robot message (a CALLBACK frame's data) as an InboundMessage, or None.

    conversationType "1" is a DM, keyed by the sender's staff id (what the robot API sends
    to); "2" is a group, keyed by its openConversationId, addressed by an @mention."""
    try:
        text = message_text(data)
        msg_id = str(data["msgId"])
        staff, sender = data.get("senderStaffId"), data.get("senderId")
        if not text or not (staff or sender):
            return None
        user = str(staff or sender)
        received = int(data.get("createAt") or 0) / 1000
        name, title = data.get("senderNick"), data.get("conversationTitle")
        if str(data.get("conversationType")) == "1":
            chat_id = str(staff or data["conversationId"])
            source = SessionSource(PLATFORM, chat_id, ChatType.DM, user, name)
            addressed = True
        else:
            bot = data.get("chatbotUserId")
            at = [u.get("dingtalkId") for u in data.get("atUsers") or [] if isinstance(u, dict)]
            addressed = bool(data.get("isInAtList")) or (bot in at) or not require_mention
            source = SessionSource(
                PLATFORM, str(data["conversationId"]), ChatType.GROUP, user, name, title
            )
        return InboundMessage(
            source=source,
            text=text,
            platform_message_id=msg_id,
            received_at=received,
            mentioned=addressed,
            reply_to=msg_id,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        log.info("ignored a malformed DingTalk robot message: %.200r", data)
        return None


def title_of(text: str) -> str:
    """The notification title DingTalk requires: the first words, markdown marks removed."""
    for line in text.splitlines():
        plain = " ".join(re.sub(r"[#*_`>\[\]()~|-]+", " ", line).split())
        if plain:
            return plain[:30]
    return "switchboard"


class _QuietPings(logging.Filter):
    """dingtalk-stream answers SYSTEM pings correctly but warns "unknown message topic"
    for each one; that warning is dropped, every other one kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (str(record.msg).startswith("unknown message topic") and args[:1] == ("ping",))


QUIET_PINGS = _QuietPings()


class DingTalkAdapter(NoThreads, Outbound, SetupSteps):
    platform: ClassVar[str] = PLATFORM
    settings: ClassVar[type[DingTalkSettings]] = DingTalkSettings
    drain_per_second: ClassVar[float] = (
        0.3  # the outbox's backlog pace (DingTalk: 20 a minute per robot)
    )
    library_loggers: ClassVar[tuple[str, ...]] = ("dingtalk_stream",)

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: DingTalkSettings) -> list[SecretNeed]:
        return [
            SecretNeed("token_env", "DINGTALK_CLIENT_SECRET", "the DingTalk client secret"),
            SecretNeed("client_id_env", "DINGTALK_CLIENT_ID", "the DingTalk client id (AppKey)"),
        ]

    @classmethod
    def problems(cls, settings: DingTalkSettings, api_enabled: bool) -> list[ConfigError]:
        if find_spec("dingtalk_stream") is None:
            return [
                ConfigError(
                    "platforms.dingtalk",
                    "needs the dingtalk-stream package: pip install 'switchboard[dingtalk]'",
                )
            ]
        return []

    @classmethod
    def from_config(cls, settings: DingTalkSettings, secrets: Mapping[str, str]) -> DingTalkAdapter:
        return cls(
            secrets.get("client_id_env", ""),
            secrets.get("token_env", ""),
            robot_code=settings.robot_code,
            base_url=settings.base_url,
            require_mention=settings.require_mention,
        )

    @classmethod
    def setup_steps(cls, settings: DingTalkSettings) -> list[str]:
        """What to do on dingtalk's side (`switchboard setup` prints it)."""
        return [
            "open-dev.dingtalk.com: an internal app; copy its Client ID and Client Secret "
            "(DINGTALK_CLIENT_ID, DINGTALK_CLIENT_SECRET)",
            "add the Robot capability with Stream mode (nothing to expose: the daemon "
            "connects out), grant robot message sending, publish, add the robot to groups",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {}

    @classmethod
    async def check_credentials(
        cls, settings: DingTalkSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        api = DingTalkApi(
            secrets.get("client_id_env", ""), secrets.get("token_env", ""), settings.base_url
        )
        try:
            await api.access_token()
        except InvalidToken as exc:
            return False, str(exc)
        except AdapterError as exc:
            return False, f"unreachable ({type(exc.__cause__ or exc).__name__})"
        finally:
            await api.close()
        return True, settings.robot_code or api.client_id

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """Group conversations are cid...; anything else is a user's staff id."""
        return "group" if chat_id.startswith("cid") else "dm"

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        client_id: str,
        client_secret: str,
        *,
        robot_code: str | None = None,
        base_url: str | None = None,
        require_mention: bool = True,
        backoff: Backoff = DEFAULT_BACKOFF,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = DingTalkApi(client_id, client_secret, base_url, clock)
        self._secret = client_secret
        self.robot_code = robot_code or client_id
        self._require_mention, self._backoff, self._clock = require_mention, backoff, clock
        self._emit: Emit | None = None
        self._webhooks: dict[str, tuple[str, int]] = {}  # chat_id -> (session webhook, expiry ms)
        self._stream: asyncio.Task[None] | None = None
        self._frames: set[asyncio.Task[None]] = set()
        self.connections = 0
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    async def open_outbound(self) -> str:
        """Ready to send, receiving nothing (`switchboard send` without a daemon): an
        access token, no Stream connection."""
        return await self.api.access_token()

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        try:
            await call_with_retry(self.api.access_token, backoff=self._backoff, log=log)
        except InvalidToken as exc:
            self.state = failed("invalid client secret")
            log.error("%s; the adapter is stopped", exc)
            raise
        client = await asyncio.to_thread(self._stream_client)
        self._stream = asyncio.create_task(self._run(client), name="dingtalk.stream")
        self.state = AdapterState.RUNNING

    def _stream_client(self) -> Any:
        """dingtalk-stream's client, used for its frame routing and acks (not its loop)."""
        import dingtalk_stream

        client = dingtalk_stream.DingTalkStreamClient(
            dingtalk_stream.Credential(self.api.client_id, self._secret),
            logger=logging.getLogger("dingtalk_stream.client"),
        )
        adapter = self

        class RobotMessages(dingtalk_stream.CallbackHandler):
            async def process(self, message: Any) -> tuple[int, str]:
                return await adapter._on_message(message.data)

        client.register_callback_handler(TOPIC, RobotMessages())
        if QUIET_PINGS not in client.logger.filters:
            client.logger.addFilter(QUIET_PINGS)
        client.pre_start()
        logging.getLogger("dingtalk_stream.handler").setLevel(logging.NOTSET)  # it forces INFO
        return client

    async def stop(self) -> None:
        self._emit = None
        tasks = [t for t in (self._stream, *self._frames) if t is not None]
        for task in tasks:
            task.cancel()  # a frame cut short is never acked: DingTalk delivers it again
        await asyncio.gather(*tasks, return_exceptions=True)
        self._stream = None
        await self.api.close()
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {"state": self.state, "connections": self.connections, "last_error": self.last_error}

    async def _run(self, client: Any) -> None:
        """Open a connection, read frames until it closes, reconnect with backoff."""
        import websockets

        attempt = 0
        while True:
            try:
                url = await call_with_retry(
                    lambda: self.api.open_connection([TOPIC]), backoff=self._backoff, log=log
                )
                async with websockets.connect(url, open_timeout=15) as ws:
                    client.websocket, attempt = ws, 0
                    self.connections += 1
                    self.state = AdapterState.RUNNING
                    async for raw in ws:
                        task = asyncio.create_task(
                            self._frame(client, ws, raw), name="dingtalk.frame"
                        )
                        self._frames.add(task)
                        task.add_done_callback(self._frames.discard)
            except InvalidToken as exc:
                self.state, self.last_error = failed("stream refused"), str(exc)
                log.error("%s; the adapter is stopped", exc)
                return
            except (TransientError, OSError, websockets.WebSocketException) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("dingtalk stream lost (%s); reconnecting", self.last_error)
            await asyncio.sleep(self._backoff.delay(attempt))
            attempt += 1

    async def _frame(self, client: Any, ws: Any, raw: str | bytes) -> None:
        try:
            frame = json.loads(raw)
            if await client.route_message(frame) == "disconnect":
                await ws.close()  # DingTalk asked for a fresh connection
        except ValueError:
            log.info("ignored an unreadable stream frame: %.200r", raw)
        except Exception as exc:  # the ack could not be sent: the message will come again
            log.warning("stream frame failed: %s", exc)

    async def _on_message(self, data: Mapping[str, Any]) -> tuple[int, str]:
        """The handler the library awaits before it acks: 200 once `emit` returned."""
        msg = to_inbound(data, self._require_mention)
        if msg is None or self._emit is None:
            return (200, "ignored") if self._emit is not None else (500, "stopping")
        webhook, expires = data.get("sessionWebhook"), data.get("sessionWebhookExpiredTime")
        if webhook and expires:
            self._webhooks[msg.source.chat_id] = (str(webhook), int(expires))
        try:
            await self._emit(msg)
        except NotAccepted:
            return 500, "not stored"
        return 200, "OK"

    # --- sending --------------------------------------------------------------------------

    def _webhook_for(self, chat_id: str) -> str | None:
        found = self._webhooks.get(chat_id)
        if found and found[1] - WEBHOOK_MARGIN_MS > self._clock() * 1000:
            return found[0]
        return None

    async def _send_one(self, msg: OutboundMessage, text: str) -> str | None:
        title = title_of(text)
        webhook = self._webhook_for(msg.chat_id) if msg.reply_to else None
        if webhook and await self.api.by_webhook(webhook, title, text):
            return None  # a session webhook answers without a message id
        return await self.api.by_robot(self.robot_code, msg.chat_id, title, text)

    async def send(self, msg: OutboundMessage) -> SentRef:
        """Replies through the session webhook while it is valid; proactive messages,
        handoffs and replies after it expired through the robot API."""
        ids = []
        for part in split_message(msg.text, LIMIT):
            try:
                sent = await call_with_retry(
                    functools.partial(self._send_one, msg, part),
                    backoff=self._backoff,
                    log=log,
                )
            except AdapterError as exc:
                self.last_error = str(exc)
                raise
            if sent:
                ids.append(sent)
        return SentRef(self.platform, msg.chat_id, tuple(ids))
