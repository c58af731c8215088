"""Discord, on discord.py 2 (gateway connection with the message_content intent).

DMs are `dm`; guild text channels are `group` (chat name "<guild> / #<channel>"); a message
in a thread is `thread` with chat_id = thread_id = the thread. In guild channels the bot
answers when mentioned (or everywhere with require_mention off, or in free-response
channels); in threads it takes part in (it created them or answered there), always.
`to_inbound` is a pure function over the message's fields. Discord has no ack, so after a
(re)start the channels the bot answered in are caught up (gateway.adapters.discord_catchup).
Each part of a reply carries a nonce derived from its dedupe key, so a resend after a crash
is answered with the message already posted (exactly once within Discord's nonce window).
With `shard_count` above 1, or among replicas (a `ShardLedger`, gateway/shards.py), each
owned shard is its own `discord.Client(shard_id=k, shard_count=n)` (an AutoShardedClient
cannot change its shards while running), and REST calls go through one more client that
logs in but never connects. Discord sends a guild's events to shard (guild_id >> 22) % n
and DMs to shard 0 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Cursors,
    Emit,
    Outbound,
    RetryAfter,
    Route,
    SetupSteps,
    TransientError,
    Typing,
    UsesCursors,
    UsesShards,
    call_with_retry,
    failed,
    send_by_trace,
)
from gateway.adapters.discord_catchup import Positions, missed
from gateway.adapters.discord_shards import Shards
from gateway.adapters.discord_wire import fields_of, reply_nonce, to_inbound
from gateway.adapters.kit.lifecycle import refused
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.typing import TypingLoops
from gateway.errors import AdapterError, ConfigError, NotAccepted, PlatformRefused
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, id_list, in_range, setting
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState, ChatType

if TYPE_CHECKING:
    from gateway.shards import ShardLedger

log = logging.getLogger("gateway.adapters.discord")
LIMIT = 2000
TYPING_EVERY_S = 8.0


@dataclass(frozen=True)
class DiscordSettings(PlatformSettings):
    free_response_channels: tuple[str | int, ...] = setting((), id_list)
    gateway_url: str | None = setting(None, doc="Discord gateway websocket (a proxy)")
    catch_up_messages: int = setting(
        50, in_range(0, 1000), "after a restart, at most this many missed messages per channel"
    )
    catch_up_hours: float = setting(
        24.0, in_range(0, 720), "after a restart, missed messages older than this are skipped"
    )
    shard_count: int = setting(
        1, in_range(1, 1024), "gateway shards; among replicas each shard runs on one of them"
    )


def _point_at(api_base: str | None, gateway_url: str | None) -> None:
    """A proxy (or a test server): discord.py reads these class attributes."""
    import discord
    import yarl

    if api_base:
        discord.http.Route.BASE = api_base.rstrip("/")
    if gateway_url:
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)


class DiscordAdapter(Typing, UsesCursors, UsesShards, Outbound, SetupSteps):
    platform: ClassVar[str] = "discord"
    idempotent_replies: ClassVar[bool] = True  # nonce + enforce_nonce on every part
    settings: ClassVar[type[DiscordSettings]] = DiscordSettings
    drain_per_second: ClassVar[float] = (
        1.0  # the outbox's backlog pace (Discord: 5 per 5 seconds in a channel)
    )
    library_loggers: ClassVar[tuple[str, ...]] = ("discord",)

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: DiscordSettings) -> list[SecretNeed]:
        return [SecretNeed("token_env", "DISCORD_BOT_TOKEN", "the discord bot token")]

    @classmethod
    def problems(cls, settings: DiscordSettings, api_enabled: bool) -> list[ConfigError]:
        return []  # the token (checked as a secret) is all it needs

    @classmethod
    def from_config(cls, settings: DiscordSettings, secrets: Mapping[str, str]) -> DiscordAdapter:
        return cls(
            secrets.get("token_env", ""),
            require_mention=settings.require_mention,
            free_channels=frozenset(str(c) for c in settings.free_response_channels),
            api_base=settings.base_url,
            gateway_url=settings.gateway_url,
            catch_up_messages=settings.catch_up_messages,
            catch_up_hours=settings.catch_up_hours,
            shard_count=settings.shard_count,
        )

    def routes(self) -> Mapping[str, Route]:
        return {}  # events arrive over the gateway websocket

    @classmethod
    def setup_steps(cls, settings: DiscordSettings) -> list[str]:
        """What to do in Discord's Developer Portal (`switchboard setup` prints it)."""
        return [
            "Developer Portal -> Bot: enable the Message Content intent (privileged), "
            "copy the token",
            "OAuth2 -> URL Generator: scope bot, permissions Send Messages, Read Message "
            "History, Create Public Threads; open the URL to add the bot to a server",
        ]

    @classmethod
    async def check_credentials(
        cls, settings: DiscordSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        import aiohttp
        import discord

        _point_at(settings.base_url, settings.gateway_url)
        http = discord.http.HTTPClient(asyncio.get_running_loop())
        try:
            async with asyncio.timeout(10):
                me = await http.static_login(secrets.get("token_env", ""))  # GET /users/@me
        except discord.LoginFailure:
            return False, "HTTP 401"
        except discord.HTTPException as exc:
            return False, f"HTTP {exc.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return False, f"unreachable ({type(exc).__name__})"
        finally:
            await http.close()
        return True, str(me["username"])

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        return "group"  # a channel id; a DM channel cannot hold the bot's threads

    @classmethod
    def thread_source(cls, thread: ThreadRef) -> SessionSource:
        """A Discord thread is its own channel."""
        return SessionSource(
            cls.platform, thread.thread_id, ChatType.THREAD, thread_id=thread.thread_id
        )

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        token: str,
        *,
        require_mention: bool = True,
        free_channels: frozenset[str] = frozenset(),
        api_base: str | None = None,
        gateway_url: str | None = None,
        guild_ready_timeout_s: float = 2.0,
        backoff: Backoff = DEFAULT_BACKOFF,
        catch_up_messages: int = 50,
        catch_up_hours: float = 24.0,
        shard_count: int = 1,
    ) -> None:
        self._token = token
        self._shards = Shards(
            shard_count,
            new_client=self._new_client,
            login=self._login,
            connect=self._connect,
            note=self._note,
            stopping=lambda: self._stopping,
        )
        self._catch_up_messages = catch_up_messages
        self._catch_up_s = catch_up_hours * 3600
        self._positions = Positions(None)
        self._catch_up_task: asyncio.Task[None] | None = None
        self._catch_up_again = False  # a session began during the catch-up: run it again
        self._gates: list[asyncio.Event] = []  # shards' sessions waiting for a catch-up
        # live messages wait until the positions are read, and in a channel still being
        # caught up, until it is done: a channel's messages reach emit in order
        self._caught_up = asyncio.Event()
        self._pending: dict[str, asyncio.Event] = {}
        self._stopping = False
        self._require_mention = require_mention
        self._free = free_channels
        self._api_base = api_base
        self._gateway_url = gateway_url
        self._ready_timeout = guild_ready_timeout_s
        self._backoff = backoff
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._emit: Emit | None = None
        self._threads: set[str] = set()
        self._typing = TypingLoops("discord.typing", self._show_typing, every_s=TYPING_EVERY_S)
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None
        self.caught_up = 0  # messages handed over by catch-ups, for /health

    def use_cursors(self, cursors: Cursors) -> None:
        """Where the last handled message of each channel is kept across restarts."""
        self._positions = Positions(cursors)

    def use_shards(self, ledger: ShardLedger) -> None:
        """Among replicas: run only the shards this replica owns in the ledger."""
        self._shards.ledger = ledger

    @property
    def sharded(self) -> bool:
        return self._shards.sharded

    def _note(self, error: str) -> None:
        self.last_error = error

    def _new_client(self, shard: int | None, gate: asyncio.Event | None = None) -> Any:
        """A client; a shard's passes its messages on only once `gate` is open (see
        `_shard_ready`)."""
        import discord

        intents = discord.Intents.default()
        intents.message_content = True
        client = discord.Client(
            intents=intents,
            guild_ready_timeout=self._ready_timeout,
            allowed_mentions=discord.AllowedMentions(
                everyone=False, roles=False, users=True, replied_user=False
            ),
            shard_id=shard,
            shard_count=None if shard is None else self._shards.count,
            # a reply that set out late stops before its REST request is written (SetOutLate,
            # passed through untouched); the gateway websocket shares this session but runs
            # in the client's own tasks, where SEND_BY is not set
            http_trace=send_by_trace(),
        )
        if gate is None:
            client.event(self.on_message)
            client.event(self.on_ready)
            return client

        async def on_ready() -> None:
            await self._shard_ready(gate)

        async def on_message(message: Any) -> None:
            await gate.wait()
            await self.on_message(message)

        client.event(on_ready)
        client.event(on_message)
        return client

    async def _login(self, client: Any) -> None:
        import discord

        try:
            await client.login(self._token)
        except discord.LoginFailure as exc:
            error = refused(self, exc, by="discord", credential="bot token", log=log)
            await client.close()
            raise error from exc

    async def open_outbound(self) -> None:
        """Ready to send, receiving nothing (`switchboard send` without a daemon): a client
        logged in over REST (GET /users/@me), never connected to the gateway."""
        _point_at(self._api_base, self._gateway_url)
        self._client = self._new_client(None)
        await self._login(self._client)

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        _point_at(self._api_base, self._gateway_url)
        self._stopping = False
        client = self._client = self._new_client(None)
        await self._login(client)
        if self.sharded:  # this client only makes REST calls; the shards connect
            await self._shards.start()
        else:
            self._task = asyncio.create_task(self._connect(client), name="discord.gateway")
            async with asyncio.timeout(30):
                await client.wait_until_ready()
        self.state = AdapterState.RUNNING
        log.info(
            "discord connected as %s (shards here: %s)",
            client.user,
            sorted(self._shards.running) if self.sharded else "all",
        )

    def _cached(self, channel_id: int) -> Any:
        """A channel from the cache of whichever connection has it (None when none has)."""
        for client in [self._client, *self._shards.clients()]:
            found = client.get_channel(channel_id) if client is not None else None
            if found is not None:
                return found
        return None

    def _reader(self, channel_id: str) -> Any:
        """The client to read a channel's history with: a connection that has the channel
        in its cache (its guild's name and all), else the REST client."""
        found = self._cached(int(channel_id))
        for client in self._shards.clients():
            if found is not None and client.get_channel(int(channel_id)) is found:
                return client
        return self._client

    async def _connect(self, client: Any) -> None:
        """discord.py reconnects by itself (reconnect=True) on dropped connections."""
        try:
            await client.connect(reconnect=True)
        except Exception as exc:
            self.state = failed(type(exc).__name__)
            self.last_error = str(exc)
            log.error("discord gateway connection ended: %s", exc)

    async def _shard_ready(self, gate: asyncio.Event) -> None:
        """A shard's fresh session, maybe on a replica whose other shards run (one taken
        over or handed over): discord.py passes on its messages before its on_ready (while
        it waits for the guilds), and one handled then would move its channel's position
        past what reached the shard while nobody held it. So its messages wait until a
        catch-up begun after this has read the positions."""
        self._gates.append(gate)
        await self.on_ready()

    async def on_ready(self) -> None:
        """A fresh session (start-up, or a reconnect that could not RESUME): what arrived
        meanwhile is not replayed by Discord, so fetch it."""
        if self._catch_up_task is not None and not self._catch_up_task.done():
            # another shard's fresh session (several are taken at once): the running catch-up
            # may have read its channels before it connected, so read them again after it
            self._catch_up_again = True
            return
        if self._catch_up_messages <= 0 or self._catch_up_s <= 0:
            self._caught_up.set()
            self._open_gates(len(self._gates))
            return
        self._caught_up.clear()
        self._catch_up_task = asyncio.create_task(self._catch_up(), name="discord.catch_up")

    async def _catch_up(self) -> None:
        while True:
            self._catch_up_again = False
            await self._catch_up_once()
            if not self._catch_up_again or self._stopping:
                return
            self._caught_up.clear()

    def _open_gates(self, n: int) -> None:
        for gate in self._gates[:n]:
            gate.set()
        del self._gates[:n]

    async def _catch_up_once(self) -> None:
        import discord

        gates = len(self._gates)  # the sessions that began before these positions are read
        try:
            positions = await self._positions.load()
            self._pending = {channel: asyncio.Event() for channel in positions}
            self._caught_up.set()
            self._open_gates(gates)
            gates = 0
            # the most recently active channels first
            for channel, last in sorted(positions.items(), key=lambda p: -p[1]):
                try:
                    async for message in missed(
                        self._reader(channel),
                        channel,
                        last,
                        limit=self._catch_up_messages,
                        horizon_s=self._catch_up_s,
                    ):
                        if await self._take(message):
                            self.caught_up += 1
                except discord.HTTPException as exc:
                    self.last_error = f"catch-up {channel}: {exc.status}"
                    log.warning("discord catch-up of channel %s failed: %s", channel, exc)
                finally:
                    self._pending.pop(channel).set()
            if positions:
                log.info("discord caught up %d channel(s)", len(positions))
        finally:
            self._caught_up.set()
            self._open_gates(gates)
            for event in self._pending.values():
                event.set()
            self._pending = {}

    async def stop(self) -> None:
        self._stopping = True
        self._caught_up.set()
        if self._catch_up_task is not None:
            self._catch_up_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._catch_up_task
            self._catch_up_task = None
        await self._typing.close()
        await self._shards.stop()
        if self._client is not None and not self._client.is_closed():
            await self._client.close()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 5)
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        ready = [
            c for c in [self._client, *self._shards.clients()] if c is not None and c.is_ready()
        ]
        found: dict[str, object] = {
            "state": self.state,
            "last_error": self.last_error,
            "typing_in": sorted(self._typing),
            "caught_up": self.caught_up,
            "latency_ms": round(ready[0].latency * 1000, 1) if ready else None,
        }
        if self.sharded:
            found["shards"] = self._shards.health()
        return found

    # --- inbound ------------------------------------------------------------------------

    async def on_message(self, message: Any) -> None:
        await self._caught_up.wait()
        waiting = self._pending.get(str(message.channel.id))
        if waiting is not None:
            await waiting.wait()
        await self._take(message)

    async def _take(self, message: Any) -> bool:
        """Hand one message to the gateway; True when emit took it. Its channel's position
        moves only after that, so a restart fetches whatever was not taken."""
        bot_id = self._client.user.id if self._client and self._client.user else None
        fields = fields_of(message, bot_id)
        if fields.get("thread_owner_is_bot"):
            self._threads.add(str(fields["channel_id"]))
        msg = to_inbound(
            fields,
            require_mention=self._require_mention,
            free_channels=self._free,
            active_threads=self._threads,
        )
        if msg is None or self._emit is None or not msg.mentioned:
            return False
        if msg.source.chat_type == ChatType.THREAD:
            self._threads.add(msg.source.chat_id)
        if bot_id is not None:
            clean = msg.text.replace(f"<@{bot_id}>", "").replace(f"<@!{bot_id}>", "").strip()
            msg = InboundMessage(
                msg.source,
                clean or msg.text,
                msg.platform_message_id,
                msg.received_at,
                True,
                msg.reply_to,
            )
        if not await self._emit_taken(msg):
            return False
        await self._positions.advance(msg.source.chat_id, int(message.id))
        return True

    async def _emit_taken(self, msg: InboundMessage) -> bool:
        """Discord will not deliver a message again, so one the gateway could not take is
        offered again (backing off) until it is taken or the adapter stops."""
        assert self._emit is not None
        attempt = 0
        while True:
            try:
                await self._emit(msg)
                return True
            except NotAccepted as exc:
                if self._stopping:
                    log.warning(
                        "discord message %s not taken before stop (%s); a restart catches it up",
                        msg.platform_message_id,
                        exc,
                    )
                    return False
                attempt += 1
                self.last_error = f"NotAccepted: {exc}"
                log.warning(
                    "discord message %s not accepted, offering it again: %s",
                    msg.platform_message_id,
                    exc,
                )
                await asyncio.sleep(self._backoff.delay(attempt))

    # Typing shows only for a turn the router runs (not for a duplicate or a refused user),
    # and stops with the reply or when the router is done with the message, whatever the end.
    def turn_started(self, msg: InboundMessage) -> None:
        self._typing.start(msg.source.chat_id)

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        self._typing.stop(msg.source.chat_id)

    async def _show_typing(self, chat_id: str) -> None:
        await self._client.get_partial_messageable(int(chat_id)).typing()

    # --- outbound -----------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> SentRef:
        import discord

        self._typing.stop(msg.chat_id)
        channel = self._client.get_partial_messageable(int(msg.thread_id or msg.chat_id))
        ids = []
        for i, part in enumerate(split_message(msg.text, LIMIT)):
            nonce = reply_nonce(msg.dedupe_key, str(channel.id), i) if msg.dedupe_key else None

            async def attempt(part: str = part, nonce: str | None = nonce) -> Any:
                try:
                    # discord.py sends a nonce with enforce_nonce: a repeat within Discord's
                    # window answers with the message already made instead of a second one
                    return await channel.send(part, nonce=nonce)
                except discord.HTTPException as exc:
                    if exc.status == 429:  # one discord.py gave up on (e.g. an edge ban): wait
                        raise RetryAfter(5.0) from exc
                    if exc.status >= 500:
                        raise TransientError(f"discord answered {exc.status}") from exc
                    raise
                except OSError as exc:
                    raise TransientError(str(exc)) from exc

            try:
                sent = await call_with_retry(attempt, backoff=self._backoff, log=log)
            except discord.HTTPException as exc:
                self.last_error = f"{exc.status}: {exc.text}"
                raise PlatformRefused(f"discord refused the message ({exc.status})") from exc
            ids.append(str(sent.id))
        if msg.thread_id:
            self._threads.add(msg.thread_id)
        return SentRef(self.platform, msg.chat_id, tuple(ids))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """A public thread under the channel, archived after a day of quiet. A refusal is
        raised (and logged), never silently replaced by a reply in the parent channel."""
        import discord

        channel = self._cached(int(chat_id))
        if not isinstance(channel, discord.TextChannel):
            return None  # DMs and threads cannot hold threads
        try:
            thread = await channel.create_thread(
                name=name[:100], auto_archive_duration=1440, type=discord.ChannelType.public_thread
            )
        except discord.HTTPException as exc:
            log.error(
                "discord refused to create a thread in %s: %s %s", chat_id, exc.status, exc.text
            )
            raise AdapterError(f"discord refused to create the thread ({exc.status})") from exc
        self._threads.add(str(thread.id))
        return ThreadRef(self.platform, str(thread.id), str(thread.id), name)
