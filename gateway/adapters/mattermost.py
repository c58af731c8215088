"""Mattermost, on mattermostautodriver (REST API v4) plus the server's websocket event stream.

This module is the adapter the core sees: its config section, credentials, sending (split
at the server's MaxPostSize, 429s waited out), threads and typing. Posts become
InboundMessages in `mattermost_posts` (pure functions); the websocket, its reconnects and
the catch-up of posts missed while disconnected live in `mattermost_stream`. Every
websocket of the bot gets every event, so among replicas one holds it (gateway.shards.
Receiver) and catches up from the positions the last holder stored; the others only send
(typing through REST, as they have no websocket).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Cursors,
    Emit,
    Outbound,
    Route,
    SetupSteps,
    Typing,
    UsesCursors,
    UsesShards,
    call_with_retry,
    failed,
    send_by_transport,
)
from gateway.adapters.kit.chats import OpensThreads
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.typing import TypingLoops
from gateway.adapters.mattermost_posts import to_inbound
from gateway.adapters.mattermost_stream import EventStream, ServerCalls
from gateway.errors import (
    ConfigError,
    InvalidToken,
    PlatformRefused,
    RetryAfter,
    TransientError,
)
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, in_range, setting
from gateway.shards import Receiver, ShardLedger
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.mattermost")
DEFAULT_LIMIT = 16_383  # characters (runes) per post unless the server says otherwise
TYPING_EVERY_S = 4.0  # Mattermost clients show "typing" for about 5 s per event
THREAD_CACHE = 2_000


def server_url(v: Any) -> str | None:
    parts = urlsplit(str(v))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be the server's address, e.g. https://chat.example.com (got {v!r})"
    if parts.path.strip("/") or parts.query:
        return f"must be scheme://host[:port] with no path (got {v!r})"
    return None


@dataclass(frozen=True)
class MattermostSettings(PlatformSettings):
    url: str | None = setting(
        None, server_url, "the Mattermost server, e.g. https://chat.example.com"
    )
    catch_up_hours: float = setting(
        24.0, in_range(0, 720), "missed posts older than this are skipped"
    )


def split_url(url: str) -> tuple[str, str, int]:
    """scheme, host and port of a server address (the client library takes them apart)."""
    parts = urlsplit(url)
    scheme = parts.scheme or "https"
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, parts.hostname or "localhost", port


class MattermostAdapter(OpensThreads, Typing, UsesCursors, UsesShards, Outbound, SetupSteps):
    platform: ClassVar[str] = "mattermost"
    # a thread is its root post's id in its channel
    thread_chat_type: ClassVar[ChatType] = ChatType.GROUP
    settings: ClassVar[type[MattermostSettings]] = MattermostSettings
    library_loggers: ClassVar[tuple[str, ...]] = ("mattermostautodriver",)

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: MattermostSettings) -> list[SecretNeed]:
        return [
            SecretNeed("token_env", "MATTERMOST_TOKEN", "a mattermost bot or personal access token")
        ]

    @classmethod
    def problems(cls, settings: MattermostSettings, api_enabled: bool) -> list[ConfigError]:
        out = []
        if not (settings.url or settings.base_url):
            out.append(
                ConfigError(
                    "platforms.mattermost.url",
                    "is required: the server's address, e.g. https://chat.example.com",
                )
            )
        elif not settings.url and (bad := server_url(settings.base_url)):
            out.append(ConfigError("platforms.mattermost.base_url", bad))
        if importlib.util.find_spec("mattermostautodriver") is None:
            out.append(
                ConfigError(
                    "platforms.mattermost",
                    "needs the mattermostautodriver package: pip install 'switchboard[mattermost]'",
                )
            )
        return out

    @classmethod
    def from_config(
        cls, settings: MattermostSettings, secrets: Mapping[str, str]
    ) -> MattermostAdapter:
        return cls(
            secrets.get("token_env", ""),
            str(settings.url or settings.base_url),
            require_mention=settings.require_mention,
            catch_up_hours=settings.catch_up_hours,
        )

    @classmethod
    def setup_steps(cls, settings: MattermostSettings) -> list[str]:
        """What to do on mattermost's side (`switchboard setup` prints it)."""
        return [
            "System Console > Integrations > Bot Accounts: enable bot accounts, add one and "
            "copy its token (MATTERMOST_TOKEN)",
            "add the bot to the teams and channels it serves; allowlists take user ids "
            "(a profile's Copy ID), not usernames",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {}  # events arrive over the websocket the adapter opens

    @classmethod
    async def check_credentials(
        cls, settings: MattermostSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        import httpx
        from mattermostautodriver.exceptions import InvalidMattermostError, MattermostError

        driver = _driver(str(settings.url or settings.base_url), secrets.get("token_env", ""), 10)
        try:
            me = await driver.login()  # GET /api/v4/users/me
        except MattermostError as exc:
            return False, f"HTTP {exc.status_code}" + (
                " (invalid or expired token)" if exc.status_code == 401 else ""
            )
        except InvalidMattermostError as exc:
            return False, f"HTTP {exc.status_code}"
        except (httpx.HTTPError, OSError) as exc:
            return False, f"unreachable ({type(exc).__name__})"
        finally:
            await driver.close()
        return True, f"@{me.get('username')}"

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """Channel ids are opaque (a DM's looks like any other): a configured home is a
        channel, where handoffs open threads."""
        return "group"

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        token: str,
        url: str,
        *,
        require_mention: bool = True,
        catch_up_hours: float = 24.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        request_timeout_s: float = 30.0,
    ) -> None:
        self._token = token
        self._url = url.rstrip("/")
        self._require_mention = require_mention
        self._catch_up_hours = catch_up_hours
        self._backoff = backoff
        self._timeout = request_timeout_s
        self._driver: Any = None
        self._stream: EventStream | None = None
        self._cursors: Cursors | None = None
        self._emit: Emit | None = None
        self._threads: dict[tuple[str, str], bool] = {}  # (channel, root) -> bot takes part
        self._channel_types: dict[str, str] = {}
        self._usernames: dict[str, str | None] = {}
        self._typing: TypingLoops[tuple[str, str | None]] = TypingLoops(
            "mattermost.typing",
            self._show_typing,
            every_s=TYPING_EVERY_S,
            alive=lambda: self._driver is not None,
        )
        self.bot_id: str = ""
        self.bot_username: str | None = None
        self.max_post_size = DEFAULT_LIMIT
        self._receiver = Receiver(self.platform, self._open_stream, self._close_stream)
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    def use_cursors(self, cursors: Cursors) -> None:
        """Where the last post seen per channel is kept, for catching up after a restart."""
        self._cursors = cursors

    def use_shards(self, ledger: ShardLedger) -> None:
        """Among replicas: hold the websocket only while this replica owns it."""
        self._receiver.use(ledger)

    async def open_outbound(self) -> None:
        """Ready to send, receiving nothing (`switchboard send` without a daemon): the
        driver logged in (GET /users/me), no websocket."""
        self._driver = _driver(self._url, self._token, self._timeout)
        try:
            me = await self._call(self._driver.login)
        except InvalidToken as exc:
            self.state = failed("invalid token")
            log.error(
                "mattermost refused the token (401 from /api/v4/users/me); the adapter is stopped"
            )
            await self._driver.close()
            raise InvalidToken("mattermost rejected the token") from exc
        self.bot_id, self.bot_username = str(me["id"]), me.get("username")
        self.max_post_size = await self._max_post_size()

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        await self.open_outbound()
        await self._receiver.start()
        if self._stream is not None and self._stream.refused:
            await self.stop()
            self.state = failed("invalid token")
            raise InvalidToken("mattermost rejected the token on the websocket")
        self.state = AdapterState.RUNNING
        log.info(
            "mattermost connected to %s as @%s (%s)",
            self._url,
            self.bot_username,
            "websocket" if self._receiver.receiving else "sending only",
        )

    async def _open_stream(self) -> None:
        """A new stream, whose catch-up starts from the positions in the store (after a
        takeover, those of the replica that held the websocket before)."""
        await self._close_stream()
        self._stream = EventStream(
            self._url,
            self._token,
            ServerCalls(self._call, self._driver, self.bot_id),
            on_post=self._on_post,
            cursors=self._cursors,
            backoff=self._backoff,
            catch_up_hours=self._catch_up_hours,
            on_refused=self._token_refused,
        )
        await self._stream.start()

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.stop()

    async def _max_post_size(self) -> int:
        """`MaxPostSize` from the server's client config where exposed, else the default."""
        try:
            client_config = await self._call(
                lambda: self._driver.client.get("/api/v4/config/client", params={"format": "old"})
            )
            size = int(client_config.get("MaxPostSize") or DEFAULT_LIMIT)
            return size if size > 0 else DEFAULT_LIMIT
        except Exception as exc:  # refused, unreachable, not a number: the default holds
            log.info(
                "no MaxPostSize from the server (%s); using %d", type(exc).__name__, DEFAULT_LIMIT
            )
            return DEFAULT_LIMIT

    def _token_refused(self, where: str = "on the websocket") -> None:
        if self.state != failed("invalid token"):
            log.error("mattermost refused the token %s; the adapter is stopped", where)
        self.state = failed("invalid token")

    async def stop(self) -> None:
        await self._typing.close()
        await self._receiver.stop()
        await self._close_stream()
        if self._driver is not None:
            with contextlib.suppress(Exception):
                await self._driver.close()
            self._driver = None
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        stream = self._stream
        return {
            "state": self.state,
            "bot": self.bot_username,
            "last_error": self.last_error,
            "connected": bool(stream and stream.connected),
            "reconnects": stream.reconnects if stream else 0,
            "max_post_size": self.max_post_size,
            **self._receiver.health(),
        }

    # --- inbound ------------------------------------------------------------------------

    async def _on_post(self, post: dict[str, Any], data: Mapping[str, Any]) -> None:
        """One post from the stream (live or caught up). Raises NotAccepted from emit,
        so the stream leaves its cursor where it was."""
        channel = str(post.get("channel_id") or "")
        ctype = str(data.get("channel_type") or self._channel_types.get(channel) or "")
        if channel and ctype:
            self._channel_types[channel] = ctype
        root, user = str(post.get("root_id") or ""), str(post.get("user_id") or "")
        if root and ctype != "D" and user != self.bot_id and (channel, root) not in self._threads:
            await self._learn_thread(channel, root)
        active = {(channel, root)} if self._threads.get((channel, root)) else set()
        sender = data.get("sender_name") or await self._username(user)
        if data.get("sender_name") and user:
            self._usernames[user] = str(data["sender_name"]).lstrip("@")
        msg = to_inbound(
            post,
            ctype,
            bot_id=self.bot_id,
            bot_username=self.bot_username,
            mentions=data.get("mentions") or (),
            sender_name=sender,
            channel_name=data.get("channel_display_name"),
            require_mention=self._require_mention,
            active_threads=active,
        )
        if msg is None or self._emit is None or not msg.mentioned:
            return
        await self._emit(msg)
        if msg.source.thread_id and ctype != "D":
            self._remember_thread(channel, msg.source.thread_id, True)

    async def _username(self, user_id: str) -> str | None:
        """A poster's username (a caught-up post does not carry it as an event does)."""
        if not user_id or user_id == self.bot_id:
            return None
        if user_id not in self._usernames:
            try:
                user = await self._call(lambda: self._driver.users.get_user(user_id))
                self._usernames[user_id] = str(user.get("username") or "") or None
            except Exception as exc:  # the id stands in for the name
                log.info("could not read user %s: %s", user_id, type(exc).__name__)
                return None
            if len(self._usernames) > THREAD_CACHE:
                self._usernames.pop(next(iter(self._usernames)))
        return self._usernames[user_id]

    async def _learn_thread(self, channel: str, root: str) -> None:
        """Whether the bot takes part in a thread it has not seen this run (it posted the
        root or a reply), so a follow-up there needs no mention after a restart."""
        try:
            thread = await self._call(lambda: self._driver.posts.get_post_thread(root))
            posts = (thread or {}).get("posts") or {}
            self._remember_thread(
                channel, root, any(p.get("user_id") == self.bot_id for p in posts.values())
            )
        except Exception as exc:  # unknown: treated as not taking part, asked again next time
            log.info("could not read thread %s: %s", root, type(exc).__name__)

    def _remember_thread(self, channel: str, root: str, active: bool) -> None:
        self._threads[(channel, root)] = active
        if len(self._threads) > THREAD_CACHE:
            self._threads.pop(next(iter(self._threads)))

    # Typing shows only for a turn the router runs, and stops with the reply or when the
    # router is done with the message, whatever the end.
    def turn_started(self, msg: InboundMessage) -> None:
        self._typing.start((msg.source.chat_id, msg.source.thread_id))

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        self._typing.stop((msg.source.chat_id, msg.source.thread_id))

    async def _show_typing(self, where: tuple[str, str | None]) -> None:
        if self._stream is not None:
            await self._stream.typing(*where)
        else:  # a replica that does not hold the websocket
            await self._rest_typing(*where)

    async def _rest_typing(self, chat_id: str, thread_id: str | None) -> None:
        """`POST /users/{id}/typing`: the server sends the typing event for us."""
        try:
            await self._driver.users.publish_user_typing(self.bot_id, chat_id, thread_id or "")
        except Exception as exc:  # typing is a courtesy: a failure is only logged
            log.info("mattermost typing via REST failed: %s: %s", type(exc).__name__, exc)

    # --- outbound -----------------------------------------------------------------------

    async def _call(self, fn: Any) -> Any:
        """A REST call through the client library, its errors in the gateway's terms: 429
        waited out (Retry-After / X-Ratelimit-Reset), network and 5xx retried with backoff,
        401 given up at once."""
        import httpx
        from mattermostautodriver.exceptions import (
            InvalidMattermostError,
            NoAccessTokenProvided,
            TooManyRequests,
            UnknownMattermostError,
        )

        async def attempt() -> Any:
            try:
                return await fn()
            except TooManyRequests as exc:
                raise RetryAfter(exc.retry_after if exc.retry_after is not None else 1.0) from exc
            except NoAccessTokenProvided as exc:
                raise InvalidToken("mattermost answered 401") from exc
            except (UnknownMattermostError, InvalidMattermostError) as exc:
                if exc.status_code >= 500:
                    raise TransientError(f"mattermost answered {exc.status_code}") from exc
                raise
            except httpx.TransportError as exc:
                raise TransientError(f"{type(exc).__name__}: {exc}") from exc

        return await call_with_retry(attempt, backoff=self._backoff, log=log)

    async def _create_post(self, channel_id: str, text: str, root_id: str | None) -> dict[str, Any]:
        from mattermostautodriver.exceptions import InvalidMattermostError, MattermostError

        # the same pending_post_id on a retry lets the server drop a duplicate of a post
        # whose first attempt did arrive
        body = {
            "channel_id": channel_id,
            "message": text,
            "root_id": root_id or "",
            "pending_post_id": f"{self.bot_id}:{uuid.uuid4().hex}",
        }
        try:
            post: dict[str, Any] = await self._call(
                lambda: self._driver.client.post("/api/v4/posts", options=body)
            )
        except InvalidToken:
            self._token_refused("when posting (401)")
            raise
        except (MattermostError, InvalidMattermostError) as exc:
            self.last_error = f"HTTP {getattr(exc, 'status_code', '?')}: {exc}"
            raise PlatformRefused(
                f"mattermost refused the post ({getattr(exc, 'status_code', '?')})"
            ) from exc
        return post

    async def send(self, msg: OutboundMessage) -> SentRef:
        self._typing.stop((msg.chat_id, msg.thread_id))
        ids = []
        for part in split_message(msg.text, self.max_post_size):
            post = await self._create_post(msg.chat_id, part, msg.thread_id)
            ids.append(str(post.get("id")))
        if msg.thread_id:
            self._remember_thread(msg.chat_id, msg.thread_id, True)
        return SentRef(self.platform, msg.chat_id, tuple(ids))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """A root post whose id is the thread; None in a direct message, whose replies
        belong to the DM's one session anyway."""
        ctype = self._channel_types.get(chat_id)
        if ctype is None:
            channel = await self._call(lambda: self._driver.channels.get_channel(chat_id))
            ctype = self._channel_types[chat_id] = str(channel.get("type"))
        if ctype == "D":
            return None
        post = await self._create_post(chat_id, name, None)
        root = str(post["id"])
        self._remember_thread(chat_id, root, True)
        return ThreadRef(self.platform, chat_id, root, name)


def _driver(url: str, token: str, timeout_s: float) -> Any:
    from mattermostautodriver import AsyncTypedDriver

    # the library logs every refused request at ERROR itself (and sets its loggers' levels
    # on import); the adapter reports each failure once, with its meaning
    for name in ("mattermostautodriver.api", "mattermostautodriver.websocket"):
        logging.getLogger(name).setLevel(logging.CRITICAL)

    scheme, host, port = split_url(url)
    # retries are ours (call_with_retry): the library's own would hide a 429's wait; the
    # transport stops a reply whose request would leave past its SEND_BY (send_by_transport)
    return AsyncTypedDriver(
        {
            "url": host,
            "scheme": scheme,
            "port": port,
            "token": token,
            "max_retries": 0,
            "request_timeout": timeout_s,
            "transport": send_by_transport(),
        }
    )
