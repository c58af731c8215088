"""Home Assistant, over its websocket API with a long-lived access token (aiohttp).

Conversations arrive as events of a configured type (`switchboard_conversation`) that an
automation, a script or a voice pipeline fires with `text` and the user or device; each
becomes a chat message in a session of its own per user or device (homeassistant_events).
When it is stored the adapter fires `switchboard_received` naming its message id, so a
script can fire again what was not taken; an event delivered twice (same context id or
message id) is answered once. Replies fire `switchboard_reply` (for an automation to speak
them), and go to a notify service and/or a persistent notification as configured. Watched
entities' state changes reach the agent as rate-limited notes. The websocket and its
reconnects live in homeassistant_ws; among replicas one subscribes (gateway.shards.
Receiver) and every replica sends over its own connection. Home Assistant has no group
chats, no threads and no typing signal.
"""

from __future__ import annotations

import asyncio
import logging
import re
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
)
from gateway.adapters.homeassistant_events import (
    NOTES_CHAT,
    PLATFORM,
    EntityNotes,
    to_inbound,
)
from gateway.adapters.homeassistant_ws import (
    TRANSIENT_CODES,
    CommandFailed,
    HaSocket,
    Subscription,
)
from gateway.adapters.kit.chats import NoThreads
from gateway.adapters.kit.split import split_message
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    NotAccepted,
    PlatformRefused,
    TransientError,
)
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.sections import PlatformSettings, SecretNeed, in_range, setting
from gateway.shards import Receiver, ShardLedger
from gateway.vocab import AdapterState

log = logging.getLogger("gateway.adapters.homeassistant")
NOTIFY_LIMIT = 2_000  # characters per notify call: phone pushes cut long payloads
EMIT_ATTEMPTS = 3  # a conversation event the store could not take is tried this often
KEY = "platforms.homeassistant"


def ha_url(v: Any) -> str | None:
    parts = urlsplit(str(v))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be Home Assistant's address, e.g. http://homeassistant.local:8123 (got {v!r})"
    return None


def event_name(v: Any) -> str | None:
    if v is None or re.fullmatch(r"[A-Za-z0-9_.-]+", str(v)):
        return None
    return f"must be an event type: letters, digits, '_', '.', '-' (got {v!r})"


def service_name(v: Any) -> str | None:
    if v is None or re.fullmatch(r"(notify\.)?[a-z0-9_]+", str(v)):
        return None
    return f"must be a notify service, e.g. mobile_app_alice_phone (got {v!r})"


def entity_ids(v: Any) -> str | None:
    bad = [x for x in v if not re.fullmatch(r"[a-z0-9_]+\.[a-z0-9_]+", str(x))]
    return f"must be entity ids like light.kitchen (got {bad[0]!r})" if bad else None


@dataclass(frozen=True)
class HomeAssistantSettings(PlatformSettings):
    url: str | None = setting(None, ha_url, "Home Assistant's address")
    event_type: str = setting("switchboard_conversation", event_name, "conversation events")
    reply_event: str | None = setting("switchboard_reply", event_name, "fired with each reply")
    received_event: str | None = setting(
        "switchboard_received", event_name, "fired when a message is stored"
    )
    notify_service: str | None = setting(None, service_name, "notify.<name> for replies")
    notify_title: str = setting("switchboard", doc="the notification title")
    persistent_notification: bool = setting(False, doc="replies also as a notification")
    watch_entities: tuple[str, ...] = setting((), entity_ids, "entities whose changes are notes")
    watch_interval_seconds: float = setting(
        60.0, in_range(0, 86_400), "at most one note per entity per interval"
    )


def _service(name: str) -> str:
    return name.removeprefix("notify.")


def _context_id(result: Any) -> str:
    context = result.get("context") if isinstance(result, Mapping) else None
    return str(context.get("id") or "") if isinstance(context, Mapping) else ""


class HomeAssistantAdapter(NoThreads, UsesShards, Outbound, SetupSteps):
    platform: ClassVar[str] = PLATFORM
    settings: ClassVar[type[HomeAssistantSettings]] = HomeAssistantSettings
    library_loggers: ClassVar[tuple[str, ...]] = ()

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: HomeAssistantSettings) -> list[SecretNeed]:
        return [SecretNeed("token_env", "HOMEASSISTANT_TOKEN", "a Home Assistant long-lived token")]

    @classmethod
    def problems(cls, settings: HomeAssistantSettings, api_enabled: bool) -> list[ConfigError]:
        out = []
        if not (settings.url or settings.base_url):
            out.append(
                ConfigError(
                    f"{KEY}.url", "is required: Home Assistant's address, e.g. http://ha.local:8123"
                )
            )
        elif not settings.url and (bad := ha_url(settings.base_url)):
            out.append(ConfigError(f"{KEY}.base_url", bad))
        for key in ("reply_event", "received_event"):
            if getattr(settings, key) == settings.event_type:
                out.append(ConfigError(f"{KEY}.{key}", "must differ from event_type"))
        if not (
            settings.reply_event or settings.notify_service or settings.persistent_notification
        ):
            out.append(
                ConfigError(
                    f"{KEY}.reply_event",
                    "is null and neither notify_service nor persistent_notification is set: "
                    "replies would reach no one",
                )
            )
        allowed = {str(u) for u in settings.allowed_users}
        if settings.watch_entities and not settings.allow_all_users and NOTES_CHAT not in allowed:
            out.append(
                ConfigError(
                    f"{KEY}.allowed_users",
                    f"must list {NOTES_CHAT!r} (the sender of watch_entities' notes) "
                    "or allow_all_users must be true",
                )
            )
        return out

    @classmethod
    def from_config(
        cls, settings: HomeAssistantSettings, secrets: Mapping[str, str]
    ) -> HomeAssistantAdapter:
        return cls(
            secrets.get("token_env", ""),
            str(settings.url or settings.base_url),
            event_type=settings.event_type,
            reply_event=settings.reply_event,
            received_event=settings.received_event,
            notify_service=settings.notify_service,
            notify_title=settings.notify_title,
            persistent_notification=settings.persistent_notification,
            watch_entities=settings.watch_entities,
            watch_interval_s=settings.watch_interval_seconds,
        )

    def routes(self) -> Mapping[str, Route]:
        return {}  # events arrive over the websocket the adapter opens

    @classmethod
    def setup_steps(cls, settings: HomeAssistantSettings) -> list[str]:
        return [
            "Profile -> Security -> Long-lived access tokens: create one for an administrator "
            "(subscribing to custom events and firing them needs an admin)",
            f"an automation fires {settings.event_type!r} with text and device_id or user "
            "(docs/platforms/homeassistant.md has the YAML for Assist)",
            f"an automation on {settings.reply_event or 'the reply event'!r} speaks the reply",
        ]

    @classmethod
    async def check_credentials(
        cls, settings: HomeAssistantSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        """Authenticate, then ask who the token's user is (an administrator is needed to
        subscribe to the conversation events) and whether the notify service exists."""
        adapter = cls.from_config(settings, secrets)
        try:
            await adapter.open_outbound()
            socket = adapter._socket_or_fail()
            found = await socket.command({"type": "get_config"})
            home = found.get("location_name") if isinstance(found, Mapping) else None
            user = await socket.command({"type": "auth/current_user"})
            who = user.get("name") if isinstance(user, Mapping) else None
            if not (isinstance(user, Mapping) and user.get("is_admin")):
                return False, (
                    f"the token's user ({who or 'unknown'}) is not an administrator: "
                    f"subscribing to {settings.event_type!r} needs one"
                )
            service = _service(settings.notify_service) if settings.notify_service else None
            if service:
                services = await socket.command({"type": "get_services"})
                notify = services.get("notify") if isinstance(services, Mapping) else None
                if not isinstance(notify, Mapping) or service not in notify:
                    return False, f"Home Assistant has no notify.{service} (notify_service)"
            version = adapter.ha_version or "?"
            return True, f"{home or 'Home Assistant'} (Home Assistant {version}) as {who}"
        except (InvalidToken, CommandFailed) as exc:
            return False, str(exc)
        except AdapterError as exc:
            return False, f"unreachable ({type(exc.__cause__ or exc).__name__})"
        finally:
            await adapter.stop()

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """Every Home Assistant conversation is one user's or one device's."""
        return "dm"

    # --- one running connection -------------------------------------------------------

    def __init__(
        self,
        token: str,
        url: str,
        *,
        event_type: str = "switchboard_conversation",
        reply_event: str | None = "switchboard_reply",
        received_event: str | None = "switchboard_received",
        notify_service: str | None = None,
        notify_title: str = "switchboard",
        persistent_notification: bool = False,
        watch_entities: tuple[str, ...] = (),
        watch_interval_s: float = 60.0,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self._token, self.url = token, url.rstrip("/")
        self.event_type, self.reply_event, self.received_event = (
            event_type,
            reply_event,
            received_event,
        )
        self.notify_service = _service(notify_service) if notify_service else None
        self.notify_title = notify_title
        self.persistent_notification = persistent_notification
        self._backoff = backoff
        self._notes = EntityNotes(watch_entities, watch_interval_s, self._take_note)
        self._socket: HaSocket | None = None
        self._emit: Emit | None = None
        self._queue: asyncio.Queue[tuple[str, Mapping[str, Any]]] = asyncio.Queue()
        self._consumer: asyncio.Task[None] | None = None
        self._receiver = Receiver(self.platform, self._begin_receiving, self._end_receiving)
        self.received = 0
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    @property
    def ha_version(self) -> str | None:
        return self._socket.ha_version if self._socket else None

    def use_shards(self, ledger: ShardLedger) -> None:
        """Among replicas: subscribe to the events only while this replica owns that."""
        self._receiver.use(ledger)

    def _socket_or_fail(self) -> HaSocket:
        if self._socket is None:
            raise TransientError("the home assistant adapter is not started")
        return self._socket

    async def _open(self) -> HaSocket:
        if self._socket is not None:  # what an earlier attempt left
            await self._socket.close()
        self._socket = HaSocket(
            self.url,
            self._token,
            on_event=self._on_event,
            backoff=self._backoff,
            on_refused=self._token_refused,
        )
        try:
            await self._socket.open()
        except InvalidToken:  # said once, naming the key, by whoever started it
            self.state = failed("invalid token")
            await self._socket.close()
            raise
        except BaseException:  # unreachable: the start is tried again from scratch
            await self._socket.close()
            raise
        return self._socket

    async def open_outbound(self) -> None:
        """Ready to send, receiving nothing: authenticated, no subscription."""
        await self._open()
        self.state = AdapterState.RUNNING

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        socket = await self._open()
        self._consumer = asyncio.create_task(self._consume(), name="homeassistant.events")
        await self._receiver.start()
        self.state = AdapterState.RUNNING
        log.info(
            "home assistant connected to %s (Home Assistant %s, %s)",
            self.url,
            socket.ha_version,
            "receiving" if self._receiver.receiving else "sending only",
        )

    async def stop(self) -> None:
        self._emit = None
        await self._receiver.stop()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.cancel()  # an event not yet taken gets no received event
            await asyncio.gather(consumer, return_exceptions=True)
        await self._notes.close()
        if self._socket is not None:
            await self._socket.close()
            self._socket = None
        if not self.state.startswith(AdapterState.FAILED):
            self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        socket = self._socket
        return {
            "state": self.state,
            "last_error": self.last_error or (socket.last_error if socket else None),
            "connected": bool(socket and socket.connected),
            "connections": socket.connections if socket else 0,
            "ha_version": socket.ha_version if socket else None,
            "received": self.received,
            **self._receiver.health(),
        }

    def _token_refused(self, why: str) -> None:
        self.state, self.last_error = failed("invalid token"), why
        log.error("%s: %s; the adapter is stopped", f"{KEY}.token_env", why)

    # --- receiving ----------------------------------------------------------------------

    async def _begin_receiving(self) -> None:
        socket = self._socket_or_fail()
        wanted = [
            Subscription(
                "conversation", {"type": "subscribe_events", "event_type": self.event_type}
            )
        ]
        if self._notes.entities:
            trigger = {"platform": "state", "entity_id": sorted(self._notes.entities), "to": None}
            wanted.append(Subscription("watch", {"type": "subscribe_trigger", "trigger": trigger}))
        try:
            for sub in wanted:
                await socket.subscribe(sub)
        except CommandFailed as exc:
            await socket.unsubscribe_all()
            if exc.code == "unauthorized":
                self.state = failed("not an administrator")
                raise InvalidToken(
                    f"home assistant refused the subscription to {self.event_type!r}: "
                    "the token's user must be an administrator"
                ) from exc
            raise TransientError(str(exc)) from exc

    async def _end_receiving(self) -> None:
        if self._socket is not None:
            await self._socket.unsubscribe_all()

    def _on_event(self, kind: str, event: Mapping[str, Any]) -> None:
        self._queue.put_nowait((kind, event))

    async def _consume(self) -> None:
        """One event at a time, in the order they came."""
        while True:
            kind, event = await self._queue.get()
            try:
                if kind == "conversation":
                    await self._conversation(event)
                elif kind == "watch":
                    variables = event.get("variables")
                    trigger = variables.get("trigger") if isinstance(variables, Mapping) else None
                    context = event.get("context")
                    if isinstance(trigger, Mapping):
                        await self._notes.offer(
                            trigger, context if isinstance(context, Mapping) else {}
                        )
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("home assistant: an event could not be handled")

    async def _conversation(self, event: Mapping[str, Any]) -> None:
        msg = to_inbound(event)
        if msg is None or not await self._take(msg):
            return
        self.received += 1
        if self.received_event:
            data = {"message_id": msg.platform_message_id, "conversation_id": msg.source.chat_id}
            try:
                await self._command(
                    {"type": "fire_event", "event_type": self.received_event, "event_data": data}
                )
            except (AdapterError, PlatformRefused) as exc:
                log.warning("home assistant: could not fire %s: %s", self.received_event, exc)

    async def _take(self, msg: InboundMessage) -> bool:
        """Hand `msg` to the core; True once it is stored (or decided)."""
        for attempt in range(EMIT_ATTEMPTS):
            emit = self._emit
            if emit is None:
                return False
            try:
                await emit(msg)
                return True
            except NotAccepted as exc:
                self.last_error = f"not stored: {exc}"
                await asyncio.sleep(self._backoff.delay(attempt))
        log.error(
            "home assistant: message %s could not be stored; no %s event is fired for it",
            msg.platform_message_id,
            self.received_event or "received",
        )
        return False

    async def _take_note(self, note: InboundMessage) -> None:
        await self._take(note)

    # --- sending --------------------------------------------------------------------------

    async def _command(self, payload: Mapping[str, Any]) -> Any:
        """One command, retried while transient; a refusal is PlatformRefused."""
        socket = self._socket_or_fail()

        async def attempt() -> Any:
            try:
                return await socket.command(payload)
            except CommandFailed as exc:
                if exc.code in TRANSIENT_CODES:
                    raise TransientError(str(exc)) from exc
                raise PlatformRefused(str(exc)) from exc

        return await call_with_retry(attempt, backoff=self._backoff, log=log)

    async def _call_service(self, domain: str, service: str, data: Mapping[str, Any]) -> str:
        payload = {"type": "call_service", "domain": domain, "service": service}
        return _context_id(await self._command({**payload, "service_data": dict(data)}))

    async def send(self, msg: OutboundMessage) -> SentRef:
        """The reply event (for an automation to speak), then the notify service (the
        conversation's own when it is a notify target), then a persistent notification."""
        chat, ids = msg.chat_id, []
        try:
            if self.reply_event:
                data: dict[str, Any] = {
                    "text": msg.text,
                    "conversation_id": chat,
                    "reply_to": msg.reply_to,
                }
                if chat.startswith("device."):
                    data["device_id"] = chat.removeprefix("device.")
                elif chat.startswith("user."):
                    data["user"] = chat.removeprefix("user.")
                fired = await self._command(
                    {"type": "fire_event", "event_type": self.reply_event, "event_data": data}
                )
                ids.append(_context_id(fired))
            target = _service(chat) if chat.startswith("notify.") else self.notify_service
            if target:
                for part in split_message(msg.text, NOTIFY_LIMIT):
                    ids.append(
                        await self._call_service(
                            "notify", target, {"message": part, "title": self.notify_title}
                        )
                    )
            if self.persistent_notification:
                ids.append(
                    await self._call_service(
                        "persistent_notification",
                        "create",
                        {"message": msg.text, "title": self.notify_title},
                    )
                )
        except (AdapterError, PlatformRefused) as exc:
            self.last_error = str(exc)
            raise
        return SentRef(self.platform, chat, tuple(i for i in ids if i))
