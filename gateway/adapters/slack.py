"""Slack, on slack-bolt (HTTP Events API mode, mounted on the daemon's HTTP server).

Requests are signature-checked by Bolt; bot messages, edits and deletes are ignored.
`to_inbound` is a pure function of the event. A top-level mention in a channel starts a
thread; threads the bot has answered in continue without a mention. Bolt runs with
`process_before_response`, so the Events API response and the Socket Mode ack go out only
after `emit` returned; a message the gateway could not take is answered 503 (no ack), and
Slack sends it again. Slack's retries of a taken message end at the core's dedupe.
Each part of a reply carries its dedupe key in message metadata; a start-up resend reads the
conversation first and posts only the parts it does not hold (exactly once).
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Emit,
    Outbound,
    RetryAfter,
    Route,
    SetupSteps,
    TransientError,
    call_with_retry,
    failed,
    send_by_trace,
)
from gateway.adapters.kit.chats import OpensThreads
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.webhook import api_server_off
from gateway.errors import ConfigError, InvalidToken, NotAccepted, PlatformRefused
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, platform_mode, setting
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.slack")
LIMIT = 39_000
SEEN_EVENTS = 10_000
IGNORED_SUBTYPES = {
    "bot_message",
    "message_changed",
    "message_deleted",
    "channel_join",
    "channel_leave",
}
EVENTS_PATH = "/slack/events"
REPLY_EVENT = "switchboard_reply"  # the metadata event type marking a reply's parts
HISTORY_PAGE = 100  # messages per page read before a resend
HISTORY_PAGES = 3


@dataclass(frozen=True)
class SlackSettings(PlatformSettings):
    mode: str | None = setting("http", platform_mode("slack", "http", "socket"))
    signing_secret_env: str | None = setting(None, env_name, "Slack signing secret env var")
    app_token_env: str | None = setting(None, env_name, "Slack Socket Mode app token env var")


def to_inbound(
    event: Mapping[str, Any],
    bot_user_id: str | None,
    active_threads: set[tuple[str, str]] | None = None,
    require_mention: bool = True,
) -> InboundMessage | None:
    """A Slack message event as an InboundMessage, or None when it is not for us."""
    try:
        if event.get("type") not in ("message", "app_mention"):
            return None
        if event.get("subtype") in IGNORED_SUBTYPES or event.get("bot_id") or event.get("subtype"):
            return None
        user, channel, ts = event.get("user"), event["channel"], event["ts"]
        text = event.get("text")
        if not isinstance(text, str) or not text.strip() or not user or user == bot_user_id:
            return None
        channel_type = event.get("channel_type") or (
            "im" if str(channel).startswith("D") else "channel"
        )
        mention = f"<@{bot_user_id}>" if bot_user_id else None
        mentioned_here = bool(mention and mention in text) or event.get("type") == "app_mention"
        if channel_type in ("im", "mpim"):
            source = SessionSource("slack", str(channel), ChatType.DM, str(user), None)
            addressed = True
        else:
            thread = event.get("thread_ts")
            in_known_thread = thread is not None and (str(channel), str(thread)) in (
                active_threads or set()
            )
            addressed = mentioned_here or in_known_thread or not require_mention
            # a top-level mention starts a thread at this message
            thread_id = str(thread) if thread is not None else (str(ts) if addressed else None)
            source = SessionSource(
                "slack", str(channel), ChatType.GROUP, str(user), None, None, thread_id
            )
        clean = text.replace(mention, "").strip() if mention else text
        return InboundMessage(
            source=source,
            text=clean or text,
            platform_message_id=str(ts),
            received_at=float(ts),
            mentioned=addressed,
            reply_to=str(ts),
        )
    except (KeyError, TypeError, ValueError):
        log.info("ignored a malformed Slack event: %.200r", event)
        return None


def reply_metadata(key: str, part: int) -> dict[str, Any]:
    """The message metadata marking part `part` of the reply under `key`."""
    return {"event_type": REPLY_EVENT, "event_payload": {"key": key, "part": part}}


def posted_part(message: Mapping[str, Any], key: str | None) -> int | None:
    """Which part of the reply under `key` a conversation message is, or None."""
    meta = message.get("metadata")
    if not isinstance(meta, Mapping) or meta.get("event_type") != REPLY_EVENT:
        return None
    payload = meta.get("event_payload")
    if not isinstance(payload, Mapping) or payload.get("key") != key:
        return None
    part = payload.get("part")
    return part if isinstance(part, int) and not isinstance(part, bool) else None


_BOLD = re.compile(r"\*\*(.+?)\*\*")
_LINK = re.compile(r"\[([^\]]+)\]\((https?://[^)\s]+)\)")


def to_mrkdwn(text: str) -> str:
    """Markdown bold and links in Slack's mrkdwn; code spans and fences are the same."""
    out = []
    for i, chunk in enumerate(text.split("```")):
        if i % 2 == 0:
            chunk = _LINK.sub(r"<\2|\1>", _BOLD.sub(r"*\1*", chunk))
        out.append(chunk)
    return "```".join(out)


class SlackAdapter(OpensThreads, Outbound, SetupSteps):
    platform: ClassVar[str] = "slack"
    # a thread is a seed message's ts in its channel
    thread_chat_type: ClassVar[ChatType] = ChatType.GROUP
    idempotent_replies: ClassVar[bool] = True  # a resend skips parts marked in metadata
    settings: ClassVar[type[SlackSettings]] = SlackSettings
    drain_per_second: ClassVar[float] = (
        1.0  # the outbox's backlog pace (Slack: about 1 a second in a channel)
    )
    library_loggers: ClassVar[tuple[str, ...]] = ("slack_bolt",)

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: SlackSettings) -> list[SecretNeed]:
        needs = [SecretNeed("token_env", "SLACK_BOT_TOKEN", "the slack bot token")]
        if settings.mode == "socket":
            needs.append(SecretNeed("app_token_env", "SLACK_APP_TOKEN", "Socket Mode app token"))
        else:
            needs.append(
                SecretNeed("signing_secret_env", "SLACK_SIGNING_SECRET", "request signing")
            )
        return needs

    @classmethod
    def problems(cls, settings: SlackSettings, api_enabled: bool) -> list[ConfigError]:
        if settings.mode == "socket":
            return []
        return api_server_off(cls.platform, api_enabled, served="Slack's Events API is")

    @classmethod
    def from_config(cls, settings: SlackSettings, secrets: Mapping[str, str]) -> SlackAdapter:
        socket_mode = settings.mode == "socket"
        return cls(
            secrets.get("token_env", ""),
            secrets.get("signing_secret_env", ""),
            base_url=settings.base_url,
            require_mention=settings.require_mention,
            app_token=secrets.get("app_token_env") if socket_mode else None,
        )

    def routes(self) -> Mapping[str, Route]:
        return {} if self._app_token else {EVENTS_PATH: self.handle_events}

    @classmethod
    def setup_steps(cls, settings: SlackSettings) -> list[str]:
        """What to do in the Slack app's settings (`switchboard setup` prints it)."""
        return [
            "OAuth & Permissions: bot scopes chat:write, im:history, channels:history, "
            "app_mentions:read; install the app to the workspace for the xoxb- token",
            "Event Subscriptions: bot events message.im, app_mention (and message.channels "
            "to answer without a mention); Socket Mode needs an xapp- app token instead of "
            "a public Request URL",
        ]

    @classmethod
    async def check_credentials(
        cls, settings: SlackSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        import aiohttp
        from slack_sdk.errors import SlackApiError
        from slack_sdk.web.async_client import AsyncWebClient

        base_url = settings.base_url.rstrip("/") + "/" if settings.base_url else None
        client = AsyncWebClient(
            token=secrets.get("token_env", ""),
            base_url=base_url or AsyncWebClient.BASE_URL,
            timeout=10,
        )
        try:
            auth = await client.auth_test()
        except SlackApiError as exc:
            return False, str(exc.response.get("error"))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return False, f"unreachable ({type(exc).__name__})"
        return True, str(auth.get("user"))

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """Slack's DM channel ids start with D."""
        return "dm" if chat_id.startswith("D") else "group"

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        token: str,
        signing_secret: str,
        *,
        base_url: str | None = None,
        require_mention: bool = True,
        backoff: Backoff = DEFAULT_BACKOFF,
        app_token: str | None = None,
    ) -> None:
        # Socket Mode when an app token is given: Slack pushes events over a websocket the
        # adapter opens (no public endpoint); otherwise the Events API (handle_events).
        self._app_token = app_token
        self._socket: Any = None
        from slack_bolt.async_app import AsyncApp
        from slack_sdk.web.async_client import AsyncWebClient

        kwargs: dict[str, Any] = {"base_url": base_url} if base_url else {}
        self.client = AsyncWebClient(token=token, **kwargs)
        # Socket Mode requests are not signed; Bolt still wants a secret to hold
        secret = signing_secret or ("socket-mode" if app_token else "")
        # the listener (which awaits emit) runs before Bolt answers: inbox before ack
        self.bolt = AsyncApp(
            client=self.client, signing_secret=secret, process_before_response=True
        )
        self.bolt.event("message")(self._on_event)
        self.bolt.event("app_mention")(self._on_event)  # same message; whichever comes first
        self.bolt.error(self._on_error)
        self._require_mention = require_mention
        self._backoff = backoff
        self._emit: Emit | None = None
        self._seen_events: OrderedDict[str, None] = OrderedDict()
        self._active_threads: set[tuple[str, str]] = set()
        self._dispatched: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.bot_user_id: str | None = None
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    async def handle_events(self, request: Any) -> Any:
        """POST /slack/events on the daemon's HTTP server: Bolt checks the signature and
        the timestamp, acks, and dispatches to the listeners. The api server serves this
        route before the adapter has started (and after it stopped): until then an event
        is answered 503, so Slack delivers it again instead of it being acked untaken."""
        from aiohttp import web
        from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request

        if self._emit is None or self.state != AdapterState.RUNNING:
            return web.Response(status=503, text="not running")
        response = await self.bolt.async_dispatch(await to_bolt_request(request))
        return await to_aiohttp_response(response)

    async def open_outbound(self) -> Any:
        """Ready to send, receiving nothing (`switchboard send` without a daemon): the HTTP
        session and auth.test, no Socket Mode link; the auth.test answer is returned."""
        import aiohttp
        from slack_sdk.errors import SlackApiError

        if self.client.session is None or self.client.session.closed:
            # one session (kept-alive connections) whose requests check SEND_BY
            self.client.session = aiohttp.ClientSession(trace_configs=[send_by_trace()])
        try:
            auth = await self.client.auth_test()
        except SlackApiError as exc:
            self.state = failed("invalid token")
            log.error(
                "slack refused the bot token; the adapter is stopped (%s)",
                exc.response.get("error"),
            )
            raise InvalidToken("slack rejected the bot token") from exc
        self.bot_user_id = auth.get("user_id")
        return auth

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        auth = await self.open_outbound()
        self._prime_authorization(auth)
        if self._app_token:
            from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

            # reuses self.client (and its base_url) for apps.connections.open; reconnects
            # on its own when Slack asks for a refresh or the link dies
            self._socket = AsyncSocketModeHandler(self.bolt, self._app_token)
            await self._socket.connect_async()
        self.state = AdapterState.RUNNING

    def _prime_authorization(self, auth: Any) -> None:
        """Hand Bolt's single-workspace authorization the auth.test answer start-up just
        got. Otherwise it calls auth.test itself until its first answer is cached, and a
        burst of Socket Mode envelopes after a restart (each in its own task) would pass
        that call in any order: a channel's messages reached the inbox out of the order
        Slack sent them (the Socket Mode fault chain caught it in 2 of 3 runs)."""
        from slack_bolt.middleware.authorization.async_single_team_authorization import (
            AsyncSingleTeamAuthorization,
        )

        for middleware in getattr(self.bolt, "_async_middleware_list", ()):
            if isinstance(middleware, AsyncSingleTeamAuthorization):
                middleware.auth_test_result = auth

    async def stop(self) -> None:
        if self._socket is not None:
            await self._socket.close_async()
            self._socket = None
        session, self.client.session = self.client.session, None
        if session is not None:
            await session.close()
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {"state": self.state, "bot_user": self.bot_user_id, "last_error": self.last_error}

    def _first_time(self, table: OrderedDict[Any, None], key: Any) -> bool:
        if key in table:
            return False
        table[key] = None
        if len(table) > SEEN_EVENTS:
            table.popitem(last=False)
        return True

    async def _on_event(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        # The two tables are only a shortcut for retries of what emit already took; they
        # are filled after emit returned, so a retry racing the first delivery still goes
        # to emit (the core dedupes on (channel, ts)) and a refused one is never skipped.
        event_id = str(body.get("event_id") or "")
        if event_id and event_id in self._seen_events:
            return  # Slack retried an event we already took
        msg = to_inbound(
            event,
            self.bot_user_id or (body.get("authorizations") or [{}])[0].get("user_id"),
            self._active_threads,
            self._require_mention,
        )
        if msg is None or self._emit is None or not msg.mentioned:
            return
        taken = (msg.source.chat_id, msg.platform_message_id)
        if taken in self._dispatched:
            return  # the same message as `message` and as `app_mention`
        if msg.source.thread_id:
            self._active_threads.add((msg.source.chat_id, msg.source.thread_id))
        await self._emit(msg)
        self._first_time(self._dispatched, taken)
        if event_id:
            self._first_time(self._seen_events, event_id)

    async def _on_error(self, error: Exception, body: dict[str, Any]) -> Any:
        """A listener failed, so the event was not taken: answer 503 (over Socket Mode, no
        ack), and Slack delivers it again."""
        from slack_bolt.response import BoltResponse

        event_id = body.get("event_id") if isinstance(body, dict) else None
        if isinstance(error, NotAccepted):
            log.warning("slack event %s not accepted (Slack will retry): %s", event_id, error)
        else:
            log.error("slack event %s failed (Slack will retry)", event_id, exc_info=error)
        return BoltResponse(status=503, body="not accepted, retry")

    async def _post(self, **kwargs: Any) -> Any:
        return await self._call(self.client.chat_postMessage, **kwargs)

    async def _call(self, method: Any, **kwargs: Any) -> Any:
        """A Web API call, waiting out rate limits and backing off on 5xx."""
        from slack_sdk.errors import SlackApiError

        async def attempt() -> Any:
            try:
                return await method(**kwargs)
            except SlackApiError as exc:
                status = exc.response.status_code
                if status == 429:
                    raise RetryAfter(float(exc.response.headers.get("Retry-After", "1"))) from exc
                if status >= 500:
                    raise TransientError(f"slack answered {status}") from exc
                if exc.response.get("error") in ("invalid_auth", "not_authed", "token_revoked"):
                    raise InvalidToken(str(exc.response.get("error"))) from exc
                raise
            except OSError as exc:
                raise TransientError(str(exc)) from exc

        return await call_with_retry(attempt, backoff=self._backoff, log=log)

    async def send(self, msg: OutboundMessage) -> SentRef:
        from slack_sdk.errors import SlackApiError

        key = msg.dedupe_key
        # a resend, or a reply that set out late (another replica may have sent it meanwhile)
        shown = await self._already_posted(msg) if key and (msg.resend or msg.late()) else {}
        ids = []
        for i, part in enumerate(split_message(to_mrkdwn(msg.text), LIMIT)):
            if i in shown:  # posted before (a crash, or another replica): the chat has it
                ids.append(shown[i])
                continue
            kwargs: dict[str, Any] = {"channel": msg.chat_id, "text": part}
            if msg.thread_id:
                kwargs["thread_ts"] = msg.thread_id
            if key:
                kwargs["metadata"] = reply_metadata(key, i)
            try:
                resp = await self._post(**kwargs)
            except SlackApiError as exc:
                self.last_error = str(exc.response.get("error"))
                raise PlatformRefused(f"slack refused the message: {self.last_error}") from exc
            ids.append(str(resp.get("ts")))
        if msg.thread_id:
            self._active_threads.add((msg.chat_id, msg.thread_id))
        return SentRef(self.platform, msg.chat_id, tuple(ids))

    async def _already_posted(self, msg: OutboundMessage) -> dict[int, str]:
        """The parts of the reply under `msg.dedupe_key` the conversation already holds
        (part -> ts), read from its newest messages after the one the reply answers (at
        most HISTORY_PAGES pages). Unreadable: none, so every part is sent (at least once)."""
        from slack_sdk.errors import SlackApiError

        kw: dict[str, Any] = {
            "channel": msg.chat_id,
            "include_all_metadata": True,
            "limit": HISTORY_PAGE,
        }
        if msg.reply_to:
            kw["oldest"] = msg.reply_to
        if msg.thread_id:
            read, kw["ts"] = self.client.conversations_replies, msg.thread_id
        else:
            read = self.client.conversations_history
        found: dict[int, str] = {}
        try:
            for _ in range(HISTORY_PAGES):
                resp = await self._call(read, **kw)
                for m in resp.get("messages") or []:
                    part = posted_part(m, msg.dedupe_key)
                    if part is not None:
                        found.setdefault(part, str(m.get("ts")))
                kw["cursor"] = (resp.get("response_metadata") or {}).get("next_cursor")
                if not kw["cursor"]:
                    break
        except (SlackApiError, TransientError) as exc:
            self.last_error = f"reading {msg.chat_id} before a resend: {exc}"
            log.warning(
                "slack: could not read %s before resending a reply (%s); sending it",
                msg.chat_id,
                exc,
            )
        return found

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """A seed message; its ts is the thread."""
        resp = await self._post(channel=chat_id, text=name)
        ts = str(resp.get("ts"))
        self._active_threads.add((chat_id, ts))
        return ThreadRef(self.platform, chat_id, ts, name)
