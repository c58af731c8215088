"""Matrix, on mautrix-python's client API (an access token, a /sync long poll).

The adapter keeps its place with the `since` token in the store (`use_cursors`): a batch's
`next_batch` is saved only after every event in it was emitted, so a restart neither
replays nor loses; a first start without a token skips the history. Every /sync with the
token gets every event, so among replicas one syncs (gateway.shards.Receiver) and takes up
the token where the last one left it; the others only send. Translation lives in
gateway.adapters.matrix_events; end-to-end encrypted rooms are not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Cursors,
    Emit,
    HomeIds,
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
from gateway.adapters.kit.chats import OpensThreads
from gateway.adapters.kit.lifecycle import refused
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.typing import TypingLoops
from gateway.adapters.matrix_events import (
    PART_BYTES,
    Me,
    inviter,
    message_content,
    part_size,
    relations,
    to_inbound,
)
from gateway.adapters.matrix_rooms import Rooms
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    NotAccepted,
    PlatformRefused,
    RetryAfter,
    TransientError,
)
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, setting
from gateway.shards import Receiver, ShardLedger
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.matrix")
TYPING_TIMEOUT_MS = 30_000  # how long the server shows typing without a renewal
TYPING_EVERY_S = 20.0
NOTE = "end-to-end encrypted rooms are not supported"
MAX_RETRY_AFTER_S = 300.0
# inline sync filters: enough timeline per room that a gap is rare (a gap is paged back
# with /messages), and no history on the very first sync
FILTER = json.dumps({"room": {"timeline": {"limit": 100}}, "presence": {"types": []}})
FIRST_FILTER = json.dumps({"room": {"timeline": {"limit": 1}}, "presence": {"types": []}})


def _room_id(v: Any) -> str | None:
    if v is None or re.fullmatch(r"![^:\s]+:\S+", str(v)):
        return None
    return f"must be a Matrix room id such as !abc123:example.org (got {v!r})"


def _user_id(v: Any) -> str | None:
    if v is None or re.fullmatch(r"@[^:\s]+:\S+", str(v)):
        return None
    return f"must be a Matrix user id such as @switchboard:example.org (got {v!r})"


def _url(v: Any) -> str | None:
    if v is None or re.fullmatch(r"https?://\S+", str(v)):
        return None
    return f"must be an http(s) URL such as https://matrix.example.org (got {v!r})"


@dataclass(frozen=True)
class MatrixSettings(PlatformSettings):
    home_channel: str | int | None = setting(None, _room_id, "handoff target room id")
    homeserver: str | None = setting(None, _url, "the homeserver's client-server API URL")
    user_id: str | None = setting(None, _user_id, "the bot's Matrix user id")


class MatrixAdapter(OpensThreads, Typing, UsesCursors, UsesShards, HomeIds, Outbound, SetupSteps):
    platform: ClassVar[str] = "matrix"
    # a thread is its root event in the room; messages in it are a shared session
    thread_chat_type: ClassVar[ChatType] = ChatType.THREAD
    settings: ClassVar[type[MatrixSettings]] = MatrixSettings
    library_loggers: ClassVar[tuple[str, ...]] = ("mau",)

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: MatrixSettings) -> list[SecretNeed]:
        return [SecretNeed("token_env", "MATRIX_ACCESS_TOKEN", "the bot's Matrix access token")]

    @classmethod
    def problems(cls, settings: MatrixSettings, api_enabled: bool) -> list[ConfigError]:
        out = []
        if importlib.util.find_spec("mautrix") is None:
            out.append(
                ConfigError(
                    "platforms.matrix",
                    "needs the mautrix package: pip install 'switchboard[matrix]'",
                )
            )
        if not settings.homeserver:
            out.append(
                ConfigError(
                    "platforms.matrix.homeserver",
                    "is required: the homeserver URL, e.g. https://matrix.example.org",
                )
            )
        if not settings.user_id:
            out.append(
                ConfigError(
                    "platforms.matrix.user_id",
                    "is required: the bot's user id, e.g. @switchboard:example.org",
                )
            )
        return out

    @classmethod
    def from_config(cls, settings: MatrixSettings, secrets: Mapping[str, str]) -> MatrixAdapter:
        return cls(
            settings.base_url or settings.homeserver or "",
            settings.user_id or "",
            secrets.get("token_env", ""),
            require_mention=settings.require_mention,
            allowed={str(u) for u in (*settings.allowed_users, *settings.admins)},
            allow_all=settings.allow_all_users,
        )

    @classmethod
    def setup_steps(cls, settings: MatrixSettings) -> list[str]:
        """What to do on matrix's side (`switchboard setup` prints it)."""
        return [
            "register an account for the bot on the homeserver and log in once to get its "
            "access token (MATRIX_ACCESS_TOKEN); logging that session out ends the token",
            "invite the bot to rooms or open a DM with it: it accepts invites from "
            "allowed_users and admins",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {}

    @classmethod
    async def check_credentials(
        cls, settings: MatrixSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        from mautrix.client import ClientAPI
        from mautrix.errors import MatrixRequestError

        from gateway.adapters.matrix_http import errcode, new_api

        api = new_api(
            settings.base_url or settings.homeserver or "", secrets.get("token_env", ""), 10
        )
        try:
            who = await ClientAPI(api=api).whoami()
        except MatrixRequestError as exc:
            return False, errcode(exc) or f"HTTP {getattr(exc, 'http_status', '?')}"
        except Exception as exc:  # a connection refused, a timeout, a bad URL
            return False, f"unreachable ({type(exc).__name__})"
        finally:
            await api.session.close()
        if settings.user_id and who.user_id != settings.user_id:
            return False, f"the token belongs to {who.user_id}, not {settings.user_id}"
        return True, f"{who.user_id} ({NOTE})"

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """A room id does not say whether the room is a DM; handoffs open a thread anyway."""
        return "group"

    @classmethod
    def split_home(cls, value: str) -> tuple[str, str | None]:
        """A room id holds a colon (`!abc:example.org`): the whole value is the room."""
        return value.strip(), None

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        homeserver: str,
        user_id: str,
        token: str,
        *,
        require_mention: bool = True,
        allowed: set[str] | frozenset[str] = frozenset(),
        allow_all: bool = False,
        poll_timeout_s: float = 30.0,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self.homeserver, self.user_id, self._token = homeserver, user_id, token
        self._require_mention = require_mention
        self._allowed, self._allow_all = frozenset(allowed), allow_all
        self._poll_timeout_s = poll_timeout_s
        self._backoff = backoff
        self._client: Any = None
        self._emit: Emit | None = None
        self._cursors: Cursors | None = None
        self._since: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._me = Me(user_id, None, require_mention)
        self._rooms = Rooms(user_id, self._fetch_members, self._fetch_sender)
        self._encrypted_noted: set[str] = set()
        self._typing: TypingLoops[str] = TypingLoops(
            "matrix.typing",
            lambda room: self._set_typing(room, TYPING_TIMEOUT_MS),
            every_s=TYPING_EVERY_S,
            for_at_most_s=math.inf,
            per_turn=True,
            withdraw=lambda room: self._set_typing(room, 0),
        )
        self._receiver = Receiver(self.platform, self._start_sync, self._stop_sync)
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    def use_cursors(self, cursors: Cursors) -> None:
        self._cursors = cursors

    def use_shards(self, ledger: ShardLedger) -> None:
        """Among replicas: sync only while this replica owns the receiving connection."""
        self._receiver.use(ledger)

    async def open_outbound(self) -> None:
        """Ready to send, receiving nothing (`switchboard send` without a daemon): the
        client and its whoami, never syncing."""
        from mautrix.client import ClientAPI
        from mautrix.types import UserID

        from gateway.adapters.matrix_http import mapped, new_api

        self._client = ClientAPI(
            UserID(self.user_id),
            api=new_api(self.homeserver, self._token, self._poll_timeout_s + 30),
        )
        try:
            who = await self._call(lambda: mapped(self._client.whoami))
            if who.user_id != self.user_id:
                raise InvalidToken(f"the access token belongs to {who.user_id}, not {self.user_id}")
        except InvalidToken as exc:
            error = refused(self, exc, by="matrix", credential="access token", log=log, detail=True)
            await self._close()
            raise error from exc
        except BaseException as exc:
            self.state = failed(f"homeserver unreachable ({exc})")
            await self._close()
            raise
        with contextlib.suppress(Exception):  # a name only sharpens mention detection
            name = await mapped(lambda: self._client.get_displayname(self.user_id))
            self._me = Me(self.user_id, name or None, self._require_mention)
        self._rooms.set_direct(await self._direct_content())

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        await self.open_outbound()
        await self._receiver.start()
        self.state = AdapterState.RUNNING
        log.info(
            "matrix as %s on %s (%s)",
            self.user_id,
            self.homeserver,
            "syncing" if self._receiver.receiving else "sending only",
        )

    async def _start_sync(self) -> None:
        """From the stored token: after a takeover, where the last syncing replica left it."""
        self._since = await self._cursors.get("since") if self._cursors else None
        self._task = asyncio.create_task(self._sync_loop(), name="matrix.sync")

    async def _stop_sync(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    async def _direct_content(self) -> Mapping[str, Any]:
        from mautrix.errors import MatrixRequestError

        from gateway.adapters.matrix_http import mapped

        try:
            content = await mapped(lambda: self._client.get_account_data("m.direct"))
        except MatrixRequestError:  # M_NOT_FOUND: the account has none
            return {}
        except TransientError as exc:
            log.warning("could not read m.direct (%s); DMs are rooms of two until it syncs", exc)
            return {}
        return content if isinstance(content, Mapping) else {}

    async def _fetch_members(self, room_id: str) -> Mapping[str, Any]:
        from gateway.adapters.matrix_http import joined_members

        try:
            return await joined_members(self._client, room_id)
        except AdapterError as exc:  # not in the room (any more): nobody known, not a DM
            log.warning("could not list the members of %s: %s", room_id, exc)
            return {}

    async def _fetch_sender(self, room_id: str, event_id: str) -> str | None:
        from gateway.adapters.matrix_http import event_sender

        return await event_sender(self._client, room_id, event_id)

    async def stop(self) -> None:
        await self._receiver.stop()
        await self._stop_sync()
        await self._typing.close()
        await self._close()
        if not str(self.state).startswith(AdapterState.FAILED):  # a failure stays visible
            self.state = AdapterState.STOPPED

    async def _close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.api.session.close()
            self._client = None

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "user_id": self.user_id,
            "since": self._since,
            "last_error": self.last_error,
            "note": NOTE,
            **self._receiver.health(),
        }

    # --- inbound: the /sync loop -------------------------------------------------------

    async def _sync_loop(self) -> None:
        attempt = 0
        while True:
            try:
                await self._sync_once()
                attempt = 0
            except InvalidToken as exc:
                self.state = failed("invalid token")
                self.last_error = str(exc)
                log.error("matrix refused the access token; the adapter is stopped (%s)", exc)
                return
            except RetryAfter as exc:
                wait = min(exc.seconds, MAX_RETRY_AFTER_S)
                log.warning("matrix sync rate limited; waiting %.1fs", wait)
                await asyncio.sleep(wait)
            except (TransientError, NotAccepted) as exc:
                self.last_error = str(exc)
                wait = self._backoff.delay(attempt)
                attempt += 1
                log.warning("matrix sync failed (%s); retrying in %.1fs", exc, wait)
                await asyncio.sleep(wait)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the loop die: log, back off, go on
                self.last_error = f"{type(exc).__name__}: {exc}"
                wait = self._backoff.delay(attempt)
                attempt += 1
                log.exception("matrix sync pass failed; retrying in %.1fs", wait)
                await asyncio.sleep(wait)

    async def _sync_once(self) -> None:
        from gateway.adapters.matrix_http import mapped

        first = self._since is None
        timeout_ms = 0 if first else int(self._poll_timeout_s * 1000)
        data = await mapped(
            lambda: self._client.sync(
                since=self._since, timeout=timeout_ms, filter_id=FIRST_FILTER if first else FILTER
            )
        )
        next_batch = data.get("next_batch") if isinstance(data, Mapping) else None
        if not isinstance(next_batch, str) or not next_batch:
            raise TransientError("the homeserver's sync answer has no next_batch")
        await self._apply(data, deliver=not first)  # raises NotAccepted: since stays
        if self._cursors is not None:
            await self._cursors.set("since", next_batch)
        self._since = next_batch
        if first:
            log.info("matrix: first sync; earlier history is skipped")

    async def _apply(self, data: Mapping[str, Any], *, deliver: bool) -> None:
        for ev in _events(data.get("account_data")):
            if ev.get("type") == "m.direct" and isinstance(ev.get("content"), Mapping):
                self._rooms.set_direct(ev["content"])
        rooms = found if isinstance(found := data.get("rooms"), Mapping) else {}
        for room_id, room in _items(rooms.get("invite")):
            await self._on_invite(room_id, room.get("invite_state") or {})
        for room_id, _room in _items(rooms.get("leave")):
            self._rooms.forget(room_id)
        for room_id, room in _items(rooms.get("join")):
            for ev in _events(room.get("state")):
                self._rooms.on_state(room_id, ev)
            timeline = line if isinstance(line := room.get("timeline"), Mapping) else {}
            events = _events(timeline)
            if deliver and timeline.get("limited") and self._since:
                events = await self._gap(room_id, timeline.get("prev_batch"), self._since) + events
            for ev in events:
                if "state_key" in ev:
                    self._rooms.on_state(room_id, ev)
                elif deliver:
                    await self._on_event(room_id, ev)

    async def _gap(self, room_id: str, prev_batch: Any, since: str) -> list[Mapping[str, Any]]:
        """The events a limited timeline left out (more arrived than a sync returns)."""
        from gateway.adapters.matrix_http import events_between

        if not isinstance(prev_batch, str) or not prev_batch:
            log.warning("room %s: a gap in the timeline without a token to fill it", room_id)
            return []
        found, complete = await events_between(self._client, room_id, prev_batch, since)
        if not complete:
            log.warning("room %s: too many missed events; the oldest are skipped", room_id)
        return [e for e in found if isinstance(e, Mapping)]

    async def _on_event(self, room_id: str, ev: Mapping[str, Any]) -> None:
        sender, event_id = ev.get("sender"), ev.get("event_id")
        if not isinstance(event_id, str) or not isinstance(sender, str):
            return
        if sender == self.user_id:  # our own sends, echoed back by the homeserver
            self._rooms.sent(event_id, sender)
            root = relations(ev.get("content") or {}).thread_root
            if root:
                self._rooms.bot_in_thread(root)
            return
        if ev.get("type") == "m.room.encrypted":
            if room_id not in self._encrypted_noted:
                self._encrypted_noted.add(room_id)
                log.warning(
                    "room %s is encrypted: encrypted rooms are not supported, its "
                    "messages are not read",
                    room_id,
                )
            return
        if ev.get("type") != "m.room.message":
            return
        view = await self._rooms.view(room_id)
        msg = to_inbound(ev, view, self._me, self._rooms.bot_threads)
        if msg is not None and not msg.mentioned:  # a reply to the bot, or in its thread?
            rel = relations(ev.get("content") or {})
            targets = [t for t in (rel.thread_root, rel.reply_to) if t]
            known = {t for t in targets if await self._rooms.is_bot_event(room_id, t)}
            if known:
                msg = to_inbound(ev, view, self._me, known)
        if msg is None or self._emit is None:
            return
        self._rooms.sent(event_id, sender)
        await self._emit(msg)  # NotAccepted: the batch is synced again, since unchanged

    async def _on_invite(self, room_id: str, invite_state: Mapping[str, Any]) -> None:
        from gateway.adapters.matrix_http import mapped

        who = inviter(invite_state, self.user_id)
        if who is None:
            return
        if not (self._allow_all or who in self._allowed):
            log.info("ignored an invite to %s from %s (not an allowed user)", room_id, who)
            return
        try:
            await self._call(lambda: mapped(lambda: self._client.join_room_by_id(room_id)))
            log.info("joined %s on the invite of %s", room_id, who)
        except Exception as exc:  # the invite stays pending; nothing else depends on it
            log.warning("could not join %s on the invite of %s: %s", room_id, who, exc)

    # --- typing: shown while a turn runs -------------------------------------------------

    def turn_started(self, msg: InboundMessage) -> None:
        self._typing.start(msg.source.chat_id)

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        self._typing.stop(msg.source.chat_id)

    async def _set_typing(self, room: str, timeout_ms: int) -> None:
        from gateway.adapters.matrix_http import mapped

        if self._client is not None:
            await mapped(lambda: self._client.set_typing(room, timeout=timeout_ms))

    # --- outbound ----------------------------------------------------------------------

    async def _call(self, fn: Any) -> Any:
        return await call_with_retry(fn, backoff=self._backoff, log=log)

    async def _post(self, room_id: str, content: dict[str, Any]) -> str:
        from mautrix.errors import MatrixRequestError
        from mautrix.types import EventType

        from gateway.adapters.matrix_http import errcode, mapped

        if self._client is None:
            raise TransientError("matrix is not running")
        txn = f"sb{uuid.uuid4().hex}"  # the same for every retry: the server sends it once
        try:
            event_id = await self._call(
                lambda: mapped(
                    lambda: self._client.send_message_event(
                        room_id, EventType.ROOM_MESSAGE, content, txn_id=txn
                    )
                )
            )
        except MatrixRequestError as exc:
            self.last_error = errcode(exc) or f"HTTP {getattr(exc, 'http_status', '?')}"
            raise PlatformRefused(f"matrix refused the message: {self.last_error}") from exc
        except (TransientError, InvalidToken) as exc:
            self.last_error = str(exc)
            raise
        self._rooms.sent(str(event_id), self.user_id)
        return str(event_id)

    async def send(self, msg: OutboundMessage) -> SentRef:
        room = msg.chat_id
        in_dm = self._rooms.is_dm(room)
        ids: list[str] = []
        for i, part in enumerate(split_message(msg.text, PART_BYTES, part_size)):
            # in a thread every part answers there; in a group room the first is a reply
            reply_to = msg.reply_to if msg.thread_id or (i == 0 and not in_dm) else None
            content = message_content(
                part,
                thread_id=msg.thread_id,
                reply_to=reply_to,
                notice=msg.notice,
                reply_sender=self._rooms.sender(reply_to) if i == 0 else None,
            )
            ids.append(await self._post(room, content))
        if msg.thread_id:
            self._rooms.bot_in_thread(msg.thread_id)
        return SentRef(self.platform, room, tuple(ids))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """A root message in the room; its event id is the thread."""
        event_id = await self._post(chat_id, message_content(name))
        self._rooms.bot_in_thread(event_id)
        return ThreadRef(self.platform, chat_id, event_id, name)


def _items(value: Any) -> list[tuple[str, Mapping[str, Any]]]:
    if not isinstance(value, Mapping):
        return []
    return [(str(k), v) for k, v in value.items() if isinstance(v, Mapping)]


def _events(section: Any) -> list[Mapping[str, Any]]:
    events = section.get("events") if isinstance(section, Mapping) else None
    return [e for e in events if isinstance(e, Mapping)] if isinstance(events, list) else []
