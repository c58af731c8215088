"""Microsoft Teams, through the Bot Framework REST API (plain aiohttp + PyJWT).

Activities arrive at `POST /teams/messages` on the daemon's HTTP server; the bearer JWT is
verified (teams_auth) before anything is read or stored, and the reply is acknowledged only
after `emit` returned. `personal` chats are DMs, `groupChat` is a group (the bot answers
when @mentioned), and a `channel` conversation `19:...;messageid=<root>` is the channel's
thread `<root>`, shared by everyone in it. Replies, typing and new channel threads go
through the Bot Connector (teams_connector) at the serviceUrl kept, per conversation, in
the adapter's cursors, so a restarted daemon can still reach a conversation.
"""

from __future__ import annotations

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
    HomeIds,
    Outbound,
    Route,
    SetupSteps,
    Typing,
    UsesCursors,
    failed,
    send_by_trace,
)
from gateway.adapters.kit.chats import OpensThreads
from gateway.adapters.kit.split import split_message, utf16_len
from gateway.adapters.kit.typing import TypingLoops
from gateway.adapters.kit.webhook import WebhookReplies, committed
from gateway.adapters.teams_auth import DEFAULT_METADATA_URL, BotFrameworkAuth, TokenRefused
from gateway.adapters.teams_connector import (
    DEFAULT_TOKEN_URL,
    BotToken,
    Connector,
    ConversationRef,
    conversation_of,
    split_conversation,
)
from gateway.errors import AdapterError, ConfigError, InvalidToken, TransientError
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, setting
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.teams")
REPLIES = WebhookReplies("error", deliver_again="not stored; send it again")
MESSAGES_PATH = "/teams/messages"
# Teams counts a bot message's whole payload in UTF-16 and refuses it (413) past a limit:
# 28 KB in older documentation, 40 KB now. Text is cut at 12,000 UTF-16 code units (24,000
# bytes), so the JSON envelope fits under the stricter figure too.
LIMIT = 12_000
DEFAULT_SERVICE_URL = "https://smba.trafficmanager.net/teams/"
TYPING_EVERY_S = 3.0
SEEN = 10_000


def _home_channel(v: Any) -> str | None:
    text = str(v).strip()
    return None if text else f"must be a Teams conversation id (got {v!r})"


@dataclass(frozen=True)
class TeamsSettings(PlatformSettings):
    home_channel: str | int | None = setting(
        None, _home_channel, "a Teams conversation id (a channel's, optionally ;messageid=<thread>)"
    )
    app_id_env: str | None = setting(None, env_name, "env var holding the bot's Microsoft app id")
    openid_metadata_url: str | None = setting(
        DEFAULT_METADATA_URL, doc="Bot Framework OpenID metadata"
    )
    token_url: str | None = setting(
        DEFAULT_TOKEN_URL, doc="OAuth token endpoint for the bot's token"
    )


def _timestamp(value: Any) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def clean_text(text: str, entities: Any, bot_ids: set[str]) -> tuple[str, bool]:
    """The text without the bot's `<at>..</at>` (others' mentions become @Name), and
    whether an entity mentions the bot."""
    mentioned = False
    for entity in entities if isinstance(entities, list) else []:
        if not isinstance(entity, dict) or entity.get("type") != "mention":
            continue
        who = entity.get("mentioned") or {}
        tag = entity.get("text")
        if not isinstance(who, dict) or not isinstance(tag, str):
            continue
        if who.get("id") in bot_ids:
            mentioned = True
            text = text.replace(tag, "")
        else:
            text = text.replace(tag, f"@{who.get('name') or who.get('id')}")
    return re.sub(r"[ \t]{2,}", " ", text).strip(), mentioned


def to_inbound(
    activity: Mapping[str, Any],
    bot_ids: set[str],
    active_threads: set[tuple[str, str]] | None = None,
    require_mention: bool = True,
) -> InboundMessage | None:
    """A Bot Framework message activity as an InboundMessage, or None when it is none
    (another activity type, the bot's own, no text, malformed)."""
    try:
        if activity.get("type") != "message":
            return None
        sender = activity["from"]
        text = activity.get("text")
        user = str(sender.get("aadObjectId") or sender["id"])
        if not isinstance(text, str) or sender.get("id") in bot_ids:
            return None
        conversation = activity["conversation"]
        kind = conversation.get("conversationType") or "personal"
        text, mentions_bot = clean_text(text, activity.get("entities"), bot_ids)
        if not text:
            return None
        activity_id = str(activity["id"])
        name = sender.get("name")
        if kind == "personal":
            source = SessionSource("teams", str(conversation["id"]), ChatType.DM, user, name)
            addressed = True
        elif kind == "groupChat":
            source = SessionSource(
                "teams",
                str(conversation["id"]),
                ChatType.GROUP,
                user,
                name,
                conversation.get("name"),
            )
            addressed = mentions_bot or not require_mention
        elif kind == "channel":
            base, root = split_conversation(str(conversation["id"]))
            channel = ((activity.get("channelData") or {}).get("channel") or {}).get("id") or base
            thread = root or activity_id  # a top-level post is the root of its own thread
            addressed = (
                mentions_bot
                or not require_mention
                or (str(channel), thread) in (active_threads or set())
            )
            source = SessionSource(
                "teams",
                str(channel),
                ChatType.CHANNEL,
                user,
                name,
                conversation.get("name"),
                thread,
            )
        else:
            return None
        return InboundMessage(
            source=source,
            text=text,
            platform_message_id=activity_id,
            received_at=_timestamp(activity.get("timestamp")),
            mentioned=addressed,
            reply_to=activity_id,
        )
    except (KeyError, TypeError, AttributeError, ValueError):
        log.info("ignored a malformed Teams activity: %.200r", activity)
        return None


class TeamsAdapter(OpensThreads, Typing, UsesCursors, HomeIds, Outbound, SetupSteps):
    platform: ClassVar[str] = "teams"
    # a thread is a channel's root message id
    thread_chat_type: ClassVar[ChatType] = ChatType.CHANNEL
    settings: ClassVar[type[TeamsSettings]] = TeamsSettings
    library_loggers: ClassVar[tuple[str, ...]] = ("jwt",)

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: TeamsSettings) -> list[SecretNeed]:
        return [
            SecretNeed("token_env", "TEAMS_APP_PASSWORD", "the bot's app password (client secret)"),
            SecretNeed("app_id_env", "TEAMS_APP_ID", "the bot's Microsoft app id"),
        ]

    @classmethod
    def problems(cls, settings: TeamsSettings, api_enabled: bool) -> list[ConfigError]:
        import importlib.util

        found = []
        if not api_enabled:
            found.append(
                ConfigError(
                    "platforms.teams.enabled",
                    "Teams posts activities to the api "
                    "server (/teams/messages): enable platforms.api",
                )
            )
        if any(importlib.util.find_spec(m) is None for m in ("jwt", "cryptography")):
            found.append(
                ConfigError(
                    "platforms.teams",
                    "needs the PyJWT package (with cryptography): pip install 'switchboard[teams]'",
                )
            )
        return found

    @classmethod
    def from_config(cls, settings: TeamsSettings, secrets: Mapping[str, str]) -> TeamsAdapter:
        return cls(
            secrets.get("app_id_env", ""),
            secrets.get("token_env", ""),
            metadata_url=settings.openid_metadata_url or DEFAULT_METADATA_URL,
            token_url=settings.token_url or DEFAULT_TOKEN_URL,
            service_url=settings.base_url or DEFAULT_SERVICE_URL,
            require_mention=settings.require_mention,
        )

    @classmethod
    def setup_steps(cls, settings: TeamsSettings) -> list[str]:
        """What to do on teams's side (`switchboard setup` prints it)."""
        return [
            "Azure portal: create an Azure Bot; note its Microsoft App ID (TEAMS_APP_ID) and "
            "create a client secret (TEAMS_APP_PASSWORD)",
            "set the bot's messaging endpoint to the URL below; under Channels add "
            "Microsoft Teams; install a Teams app manifest with the bot for its users",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {MESSAGES_PATH: self.handle_activity}

    @classmethod
    async def check_credentials(
        cls, settings: TeamsSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        """Obtaining a bot token is the check: the app id and password are what it proves."""
        import aiohttp

        app_id = secrets.get("app_id_env", "")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            token = BotToken(
                http, settings.token_url or DEFAULT_TOKEN_URL, app_id, secrets.get("token_env", "")
            )
            try:
                await token.get()
            except InvalidToken as exc:
                return False, str(exc)
            except AdapterError as exc:
                return False, f"unreachable ({exc})"
        return True, f"app {app_id}"

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """Personal chats' ids start with `a:`; group chats and channels with `19:`."""
        return "dm" if chat_id.startswith("a:") else "group"

    @classmethod
    def split_home(cls, value: str) -> tuple[str, str | None]:
        """A home channel is a conversation id: `<channel>;messageid=<thread>` names a thread."""
        return split_conversation(value)

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        app_id: str,
        password: str,
        *,
        metadata_url: str = DEFAULT_METADATA_URL,
        token_url: str = DEFAULT_TOKEN_URL,
        service_url: str = DEFAULT_SERVICE_URL,
        require_mention: bool = True,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self.app_id = app_id
        self._password = password
        self._token_url = token_url
        self._service_url = service_url
        self._require_mention = require_mention
        self._backoff = backoff
        self.auth = BotFrameworkAuth(app_id, metadata_url)
        self._http: Any = None
        self._connector: Connector | None = None
        self._emit: Emit | None = None
        self._cursors: Cursors | None = None
        self._refs: dict[str, ConversationRef] = {}
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._threads: set[tuple[str, str]] = set()
        self._typing: TypingLoops[tuple[str, str | None]] = TypingLoops(
            "teams.typing",
            self._show_typing,
            every_s=TYPING_EVERY_S,
            alive=lambda: self._connector is not None,
        )
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    def use_cursors(self, cursors: Cursors) -> None:
        """Conversation references live here (`conv:<chat id>`), so replies survive a restart."""
        self._cursors = cursors

    async def open_outbound(self) -> None:
        """Ready to send (`switchboard send` without a daemon; the daemon's start is the
        same, its webhook route then taking activities): the HTTP session and a bot token."""
        import aiohttp

        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30),
            trace_configs=[send_by_trace()],  # a reply that set out late stops here
        )
        token = BotToken(self._http, self._token_url, self.app_id, self._password)
        self._connector = Connector(self._http, token, backoff=self._backoff)
        try:
            await token.get()
        except InvalidToken as exc:
            self.state = failed("invalid app password")
            log.error("teams: %s; the adapter is stopped", exc)
            await self.stop(failed_state=self.state)
            raise InvalidToken("teams rejected the bot's app id or password") from exc
        except AdapterError as exc:  # network trouble never ends the daemon: fetched again on use
            self.last_error = str(exc)
            log.warning("teams: no bot token yet (%s); retrying when one is needed", exc)

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        await self.open_outbound()
        self.state = AdapterState.RUNNING
        log.info("teams listening on %s for app %s", MESSAGES_PATH, self.app_id)

    async def stop(self, failed_state: str | None = None) -> None:
        await self._typing.close()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self.state = failed_state or AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "app_id": self.app_id,
            "last_error": self.last_error,
            "conversations": len(self._refs),
            "typing_in": sorted(conversation_of(*at) for at in self._typing),
        }

    # --- inbound ------------------------------------------------------------------------

    async def handle_activity(self, request: Any) -> Any:
        """POST /teams/messages: verify the token, then the activity, then emit; 200 only
        once emit returned (503 when the gateway could not take it, so it is sent again)."""
        from aiohttp import web

        if self._http is None or self.state != AdapterState.RUNNING:
            return REPLIES.stopped()
        try:
            verified = await self.auth.verify(request.headers.get("Authorization"), self._http)
        except TokenRefused as exc:
            log.warning("refused a Teams request: %s", exc.reason)
            return web.json_response({"error": exc.reason}, status=exc.status)
        except TransientError as exc:
            log.error("cannot verify Teams requests: %s", exc)
            return web.json_response({"error": "cannot verify the request yet"}, status=503)
        try:
            activity = await request.json()
        except (ValueError, UnicodeDecodeError):
            return web.json_response({"error": "the body must be JSON"}, status=400)
        if not isinstance(activity, dict):
            return web.json_response({"error": "the body must be an activity"}, status=400)
        try:
            self.auth.check_activity(verified, activity)
        except TokenRefused as exc:
            log.warning("refused a Teams activity: %s", exc.reason)
            return web.json_response({"error": exc.reason}, status=exc.status)
        found = ConversationRef.of(activity)
        if found is not None:
            await self._remember(*found)
        bot_ids = {f"28:{self.app_id}"} | (
            {found[1].bot_id} if found and found[1].bot_id else set()
        )
        if found is not None and found[1].kind == "channel":
            conv = (activity.get("conversation") or {}).get("id")
            root = split_conversation(str(conv))[1]
            if root:
                await self._recall_thread(found[0], root)
        msg = to_inbound(activity, bot_ids, self._threads, self._require_mention)
        if msg is None or not msg.mentioned or self._emit is None:
            return web.Response(status=200)
        seen = (msg.source.chat_id, str(msg.platform_message_id))
        if seen in self._seen:
            return web.Response(status=200)  # a redelivery we already took
        if not await committed(self._emit, [msg]):
            return REPLIES.again()
        self._seen[seen] = None
        if len(self._seen) > SEEN:
            self._seen.popitem(last=False)
        if msg.source.thread_id:
            await self._take_part(msg.source.chat_id, msg.source.thread_id)
        return web.Response(status=200)

    async def _remember(self, chat_id: str, ref: ConversationRef) -> None:
        if self._refs.get(chat_id) == ref:
            return
        self._refs[chat_id] = ref
        if self._cursors is not None:
            await self._cursors.set(f"conv:{chat_id}", ref.dumps())

    async def _ref(self, chat_id: str) -> ConversationRef | None:
        ref = self._refs.get(chat_id)
        if ref is None and self._cursors is not None:
            stored = await self._cursors.get(f"conv:{chat_id}")
            ref = ConversationRef.loads(stored) if stored else None
            if ref is not None:
                self._refs[chat_id] = ref
        return ref

    async def _take_part(self, chat_id: str, thread_id: str) -> None:
        """A channel thread the bot started or answered in: later messages there need no
        mention (remembered across restarts)."""
        if (chat_id, thread_id) not in self._threads:
            self._threads.add((chat_id, thread_id))
            if self._cursors is not None:
                await self._cursors.set(f"thread:{chat_id}:{thread_id}", "1")

    async def _recall_thread(self, chat_id: str, thread_id: str) -> None:
        if (chat_id, thread_id) not in self._threads and self._cursors is not None:
            if await self._cursors.get(f"thread:{chat_id}:{thread_id}"):
                self._threads.add((chat_id, thread_id))

    # --- typing -------------------------------------------------------------------------

    def turn_started(self, msg: InboundMessage) -> None:
        if self._connector is not None:
            self._typing.start((msg.source.chat_id, msg.source.thread_id))

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        self._typing.stop((msg.source.chat_id, msg.source.thread_id))

    async def _show_typing(self, where: tuple[str, str | None]) -> None:
        ref = await self._ref(where[0])
        url = ref.service_url if ref else self._service_url
        if self._connector is not None:
            await self._connector.post_activity(
                url, conversation_of(*where), {"type": "typing"}, once=True
            )

    # --- outbound -----------------------------------------------------------------------

    def _refused(self, exc: InvalidToken) -> AdapterError:
        self.state = failed("invalid app password")
        self.last_error = str(exc)
        log.error("teams: %s; the adapter is stopped", exc)
        return exc

    async def send(self, msg: OutboundMessage) -> SentRef:
        if self._connector is None:
            raise TransientError("teams is not running")
        conv = conversation_of(msg.chat_id, msg.thread_id)
        self._typing.stop((msg.chat_id, msg.thread_id))
        ref = await self._ref(msg.chat_id)
        url = ref.service_url if ref else self._service_url
        ids = []
        for part in split_message(msg.text, LIMIT, utf16_len):
            activity: dict[str, Any] = {"type": "message", "text": part, "textFormat": "markdown"}
            if ref is not None and ref.bot_id:
                activity["from"] = {"id": ref.bot_id}
            try:
                sent = await self._connector.post_activity(url, conv, activity, msg.reply_to)
            except InvalidToken as exc:
                raise self._refused(exc) from exc
            except AdapterError as exc:
                self.last_error = str(exc)
                raise
            ids.append(str(sent.get("id") or ""))
        if msg.thread_id:
            await self._take_part(msg.chat_id, msg.thread_id)
        return SentRef(self.platform, msg.chat_id, tuple(ids))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """A new conversation in the channel (its first message is `name`); its root message
        id is the thread. Personal and group chats have no threads: None."""
        if self._connector is None:
            raise TransientError("teams is not running")
        ref = await self._ref(chat_id)
        is_channel = (
            ref.kind == "channel"
            if ref
            else "@thread.tacv2" in chat_id or "@thread.skype" in chat_id
        )
        if not is_channel:
            return None
        data: dict[str, Any] = {"channel": {"id": chat_id}}
        params: dict[str, Any] = {
            "isGroup": True,
            "channelData": data,
            "activity": {"type": "message", "text": name, "textFormat": "markdown"},
        }
        if ref is not None and ref.tenant_id:
            data["tenant"] = {"id": ref.tenant_id}
            params["tenantId"] = ref.tenant_id
        if ref is not None and ref.bot_id:
            params["bot"] = {"id": ref.bot_id}
        try:
            created = await self._connector.create_conversation(
                ref.service_url if ref else self._service_url, params
            )
        except InvalidToken as exc:
            raise self._refused(exc) from exc
        root = split_conversation(str(created.get("id") or ""))[1] or created.get("activityId")
        if not root:
            raise AdapterError(f"teams created a conversation with no thread id: {created!r:.200}")
        await self._take_part(chat_id, str(root))
        return ThreadRef(self.platform, chat_id, str(root), name)
