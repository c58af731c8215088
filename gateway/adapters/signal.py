"""Signal, through signal-cli's HTTP daemon (`signal-cli -a +NUMBER daemon --http`):
JSON-RPC calls to send and show typing, the server-sent event stream for incoming messages.

Signal has no threads: a group is one chat (per-user sessions, as the core keys them), a
quote of the bot's message addresses it without a mention, and handoffs go to the home
chat itself. Event ids (signal-cli after 0.14.6) are kept as a cursor, written only after the
gateway took the message, and sent back as `Last-Event-ID` when the stream reconnects.
signal-cli sends every event to every open stream, so among replicas one listens
(gateway.shards.Receiver), from the event id the last listener stored; the others only send.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import re
from collections import OrderedDict
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Cursors,
    Emit,
    Outbound,
    Route,
    SetupSteps,
    TransientError,
    Typing,
    UsesCursors,
    UsesShards,
    call_with_retry,
    failed,
    stop_task,
)
from gateway.adapters.kit.chats import NoThreads
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.typing import TypingLoops
from gateway.adapters.signal_rpc import METHOD_NOT_FOUND, SignalCliError, SignalRpc, SseParser
from gateway.adapters.signal_text import Incoming, Me, is_direct, parse_envelope, to_plain
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    NotAccepted,
    PlatformRefused,
    RetryAfter,
)
from gateway.messages import SEND_BY, InboundMessage, OutboundMessage, SentRef
from gateway.sections import PlatformSettings, SecretNeed, setting
from gateway.shards import Receiver, ShardLedger
from gateway.vocab import AdapterState

log = logging.getLogger("gateway.adapters.signal")
LIMIT = 2000  # characters per message; longer replies are split
TYPING_EVERY_S = 10.0  # a Signal typing indicator lasts 15 s unless renewed or stopped
KEEPALIVE_TIMEOUT_S = 45.0  # signal-cli writes a keep-alive every 15 s
CURSOR = "last_event_id"
SEEN = 10_000
ATTACHMENTS_NOTE = "Attachments are not supported here; please send your message as text."
_NUMBER = re.compile(r"^\+[1-9][0-9]{6,14}$")


def _url(v: Any) -> str | None:
    ok = isinstance(v, str) and re.match(r"^https?://[^/\s]+", v)
    return None if ok else f"must be an http:// or https:// address (got {v!r})"


def _number(v: Any) -> str | None:
    if isinstance(v, int):
        return _unquoted(v)
    if v is None or (isinstance(v, str) and _NUMBER.match(v)):
        return None
    return f"must be a phone number in international form, e.g. +15551234567 (got {v!r})"


def _unquoted(v: int) -> str:
    return f"YAML read {v} as a number (dropping any +): quote phone numbers, e.g. '+{v}'"


@dataclass(frozen=True)
class SignalSettings(PlatformSettings):
    url: str = setting("http://127.0.0.1:8080", _url, "signal-cli's HTTP daemon")
    account: str | int | None = setting(None, _number, "the bot's phone number")
    bot_name: str | None = setting(None, None, "a name that addresses the bot as @name")


def to_inbound(
    payload: Mapping[str, Any], me: Me, require_mention: bool = True
) -> InboundMessage | None:
    """A `receive` event as an InboundMessage, or None (not a person's text message)."""
    got = parse_envelope(payload, me, require_mention=require_mention)
    return _inbound(got) if got is not None and got.text else None


def _inbound(got: Incoming) -> InboundMessage:
    return InboundMessage(
        source=got.source,
        text=got.text,
        platform_message_id=got.message_id,
        received_at=got.sent_at,
        mentioned=got.mentioned,
        reply_to=got.message_id,
    )


class SignalAdapter(NoThreads, Typing, UsesCursors, UsesShards, Outbound, SetupSteps):
    platform: ClassVar[str] = "signal"
    settings: ClassVar[type[SignalSettings]] = SignalSettings
    drain_per_second: ClassVar[float] = (
        2.0  # the outbox's backlog pace (signal-cli: cautious, Signal rate-limits bursts)
    )
    library_loggers: ClassVar[tuple[str, ...]] = ()  # plain aiohttp, no client library

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: SignalSettings) -> list[SecretNeed]:
        """signal-cli has no authentication; a token is only sent when token_env names
        one (for an authenticating reverse proxy in front of the daemon)."""
        if settings.token_env:
            return [SecretNeed("token_env", settings.token_env, "a bearer token for url")]
        return []

    @classmethod
    def problems(cls, settings: SignalSettings, api_enabled: bool) -> list[ConfigError]:
        out = []
        if not settings.account:
            out.append(
                ConfigError(
                    "platforms.signal.account",
                    "is required: the bot's number, as registered with signal-cli",
                )
            )
        for key in ("allowed_users", "admins"):
            unquoted = [u for u in getattr(settings, key) if isinstance(u, int)]
            if unquoted:
                out.append(ConfigError(f"platforms.signal.{key}", _unquoted(unquoted[0])))
        if settings.base_url:
            out.append(
                ConfigError(
                    "platforms.signal.base_url", "is not used by signal: set platforms.signal.url"
                )
            )
        return out

    @classmethod
    def from_config(cls, settings: SignalSettings, secrets: Mapping[str, str]) -> SignalAdapter:
        return cls(
            settings.url,
            str(settings.account),
            token=secrets.get("token_env"),
            bot_name=settings.bot_name,
            require_mention=settings.require_mention,
            listed=frozenset(str(u) for u in (*settings.allowed_users, *settings.admins)),
            allow_all=settings.allow_all_users,
        )

    @classmethod
    def setup_steps(cls, settings: SignalSettings) -> list[str]:
        """What to do on signal's side (`switchboard setup` prints it)."""
        return [
            "signal-cli: register a number for the bot (`signal-cli -a NUMBER register`, then "
            "`verify CODE`) or link it to a phone (`signal-cli link -n switchboard`)",
            f"run `signal-cli -a {settings.account or 'NUMBER'} daemon --http "
            f"{settings.url.split('://', 1)[-1]} --receive-mode on-connection` as a service "
            "that starts before the gateway",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {}

    @classmethod
    async def check_credentials(
        cls, settings: SignalSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        rpc = SignalRpc(settings.url, str(settings.account), secrets.get("token_env"))
        await rpc.open(timeout_s=10)
        try:
            return True, await _ask_about_account(rpc)
        except TransientError as exc:
            return False, f"unreachable ({exc})"
        except AdapterError as exc:
            return False, str(exc)
        finally:
            await rpc.close()

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """A +number or a UUID is a person (a DM); anything else is a group id."""
        return "dm" if is_direct(chat_id) else "group"

    # --- one running bot --------------------------------------------------------------

    def __init__(
        self,
        url: str,
        account: str,
        *,
        token: str | None = None,
        bot_name: str | None = None,
        require_mention: bool = True,
        listed: frozenset[str] = frozenset(),
        allow_all: bool = True,
        backoff: Backoff = DEFAULT_BACKOFF,
        keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
    ) -> None:
        self.rpc = SignalRpc(url, account, token)
        self.me = Me(account, None, bot_name)
        self._require_mention = require_mention
        self._listed = listed  # allowlisted numbers and UUIDs: who a sender is (sender_id)
        self._allow_all = allow_all
        self._backoff = backoff
        self._keepalive_timeout = keepalive_timeout_s
        self._cursors: Cursors | None = None
        self._last_event_id: str | None = None
        self._emit: Emit | None = None
        self._listener: asyncio.Task[None] | None = None
        self._typing = TypingLoops(
            "signal.typing", self._typing_on, every_s=TYPING_EVERY_S, withdraw=self._typing_off
        )
        self._chores: set[asyncio.Task[None]] = set()  # attachment notes
        self._noted: OrderedDict[str, None] = OrderedDict()
        self.connections = 0
        self.connected = False
        self._receiver = Receiver(self.platform, self._start_listening, self._stop_listening)
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None

    def use_cursors(self, cursors: Cursors) -> None:
        self._cursors = cursors

    def use_shards(self, ledger: ShardLedger) -> None:
        """Among replicas: follow the event stream only while this replica owns it."""
        self._receiver.use(ledger)

    async def open_outbound(self) -> str:
        """Ready to send, receiving nothing (`switchboard send` without a daemon): the
        JSON-RPC link and the account check, no receive loop. Returns what signal-cli said
        of the account."""
        await self.rpc.open()
        try:
            detail = await _ask_about_account(self.rpc)
        except TransientError as exc:  # the daemon's start retries it (base.SupervisedStart)
            await self.rpc.close()
            raise TransientError(
                f"signal-cli is not reachable at {self.rpc.url}; start it with "
                f"`signal-cli -a {self.me.number} daemon --http`"
            ) from exc
        except AdapterError as exc:
            await self._fail(str(exc), exc)
        return detail

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        detail = await self.open_outbound()
        await self._receiver.start()
        self.state = AdapterState.RUNNING
        log.info(
            "signal as %s (%s)", detail, "listening" if self._receiver.receiving else "sending only"
        )

    async def _start_listening(self) -> None:
        """From the stored event id: after a takeover, where the last listener left it."""
        if self._cursors is not None:
            self._last_event_id = await self._cursors.get(CURSOR)
        self._listener = asyncio.create_task(self._listen(), name="signal.events")

    async def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        await stop_task(listener)
        self.connected = False

    async def _fail(self, why: str, exc: Exception) -> NoReturn:
        self.state = failed(why)
        log.error("%s; the signal adapter is stopped", why)
        await self.rpc.close()
        raise (InvalidToken if isinstance(exc, InvalidToken) else AdapterError)(why) from exc

    async def stop(self) -> None:
        await self._receiver.stop()
        await self._stop_listening()
        await self._typing.close()
        if self._chores:
            await asyncio.wait(self._chores, timeout=5)
        await self.rpc.close()
        self.connected = False
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "account": self.me.number,
            "connected": self.connected,
            "last_error": self.last_error,
            **self._receiver.health(),
        }

    # --- inbound: the event stream ------------------------------------------------------

    async def _listen(self) -> None:
        """Follow the event stream for good: reconnect with backoff when it drops, ends,
        stays silent past the keep-alive, or a message could not be taken (NotAccepted:
        the stream is reopened from the last taken event, so signal-cli sends it again)."""
        import aiohttp

        attempt = 0
        refused = False  # the last stream ended on a message the gateway could not take
        timeout = aiohttp.ClientTimeout(total=None, sock_read=self._keepalive_timeout)
        while True:
            headers = {"Accept": "text/event-stream"}
            if self._last_event_id:
                headers["Last-Event-ID"] = self._last_event_id
            try:
                async with self.rpc.http.get(
                    self.rpc.events_url(), headers=headers, timeout=timeout
                ) as resp:
                    if resp.status != 200:
                        raise TransientError(f"the event stream answered HTTP {resp.status}")
                    self.connections += 1
                    self.connected = True
                    attempt = attempt if refused else 0  # a store that keeps refusing: back off
                    parser = SseParser()
                    async for chunk in resp.content.iter_any():
                        for event in parser.feed(chunk):
                            await self._on_event(event.id, event.event, event.data)
                            refused = False
                self.last_error = "the event stream ended"
            except NotAccepted as exc:
                refused = True
                self.last_error = f"a message was not accepted: {exc}"
                log.warning("the gateway could not take a message; reopening the stream from it")
            except (aiohttp.ClientError, OSError, TimeoutError, TransientError) as exc:
                self.last_error = f"event stream: {type(exc).__name__}: {exc}"
                log.warning("signal event stream lost (%s); reconnecting", self.last_error)
            except Exception as exc:  # e.g. the store refused the cursor: keep listening
                self.last_error = f"event stream: {type(exc).__name__}: {exc}"
                log.exception("signal event stream failed; reconnecting")
            self.connected = False
            await asyncio.sleep(self._backoff.delay(attempt))
            attempt += 1

    async def _on_event(self, event_id: str | None, name: str, data: str) -> None:
        import json

        if name == "receive":
            try:
                payload = json.loads(data)
            except ValueError:
                log.info("ignored an event that is not JSON: %.200r", data)
                payload = None
            try:
                if isinstance(payload, dict):
                    await self._on_receive(payload)
            except NotAccepted:
                raise  # the cursor stays: the stream is reopened from here
            except Exception:  # a bug must not stop the stream, nor replay the event forever
                log.exception("a signal event could not be handled: %.200r", data)
        if event_id and event_id != self._last_event_id:
            self._last_event_id = event_id
            if self._cursors is not None:
                await self._cursors.set(CURSOR, event_id)

    async def _on_receive(self, payload: Mapping[str, Any]) -> None:
        if payload.get("account") not in (None, self.me.number):
            return  # another account of a multi-account daemon
        env = payload.get("envelope")
        if (
            isinstance(env, Mapping)
            and env.get("sourceNumber") == self.me.number
            and env.get("sourceUuid")
        ):
            self.me = Me(self.me.number, str(env["sourceUuid"]), self.me.name)  # our own UUID
        got = parse_envelope(
            payload, self.me, listed=self._listed, require_mention=self._require_mention
        )
        if got is None or self._emit is None:
            return
        if got.text:
            if got.attachments:
                log.info(
                    "%d attachment(s) from %s ignored; the text is handled",
                    got.attachments,
                    got.source.user_id,
                )
            await self._emit(_inbound(got))
        elif got.mentioned and self._may_talk(got.source.user_id) and self._first(got):
            note = OutboundMessage(
                self.platform, got.source.chat_id, ATTACHMENTS_NOTE, reply_to=got.message_id
            )
            self._chore(self._note(note), f"signal.note:{got.source.chat_id}")

    async def _note(self, note: OutboundMessage) -> None:
        """Sent beside the stream, which must not wait for it (a rate limit can be long)."""
        try:
            await self.send(note)
        except AdapterError as exc:
            log.warning("the attachments note to %s was not sent: %s", note.chat_id, exc)

    def _may_talk(self, user_id: str | None) -> bool:
        return self._allow_all or (user_id is not None and user_id in self._listed)

    def _first(self, got: Incoming) -> bool:
        key = f"{got.source.chat_id}/{got.message_id}"
        if key in self._noted:
            return False
        self._noted[key] = None
        if len(self._noted) > SEEN:
            self._noted.popitem(last=False)
        return True

    # --- typing ---------------------------------------------------------------------------

    def turn_started(self, msg: InboundMessage) -> None:
        self._typing.start(msg.source.chat_id)

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        self._typing.stop(msg.source.chat_id)

    def _chore(self, work: Coroutine[Any, Any, None], name: str) -> None:
        context = contextvars.copy_context()  # begun by a send (a typing stop): not its reply,
        context.run(SEND_BY.set, None)  # so never stopped by that reply's SEND_BY
        task = asyncio.create_task(work, name=name, context=context)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _typing_on(self, chat: str) -> None:
        await self.rpc.call("sendTyping", _target(chat))  # best effort: never worth a retry

    async def _typing_off(self, chat: str) -> None:
        await self.rpc.call("sendTyping", {**_target(chat), "stop": True})

    # --- outbound -------------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> SentRef:
        self._typing.stop(msg.chat_id)
        ids: list[str] = []
        for i, part in enumerate(split_message(to_plain(msg.text), LIMIT)):
            params: dict[str, Any] = {**_target(msg.chat_id), "message": part}
            if i == 0 and msg.reply_to and not is_direct(msg.chat_id):
                author, _, ts = msg.reply_to.rpartition(":")
                if author and ts.isdigit():  # in a group, quote the message answered
                    params.update(quoteTimestamp=int(ts), quoteAuthor=author)
            try:
                result = await call_with_retry(
                    functools.partial(self.rpc.call, "send", params), backoff=self._backoff, log=log
                )
            except (TransientError, RetryAfter, InvalidToken) as exc:
                self.last_error = str(exc)
                raise  # the outbox keeps the reply and tries again
            except AdapterError as exc:
                self.last_error = str(exc)
                raise PlatformRefused(f"signal-cli did not send the message: {exc}") from exc
            ids.append(str((result or {}).get("timestamp", "")))
        return SentRef(self.platform, msg.chat_id, tuple(ids))


def _target(chat_id: str) -> dict[str, Any]:
    return {"recipient": [chat_id]} if is_direct(chat_id) else {"groupId": chat_id}


async def _ask_about_account(rpc: SignalRpc) -> str:
    """What the daemon says about our account: a multi-account daemon lists its accounts;
    a single-account one (`-a NUMBER`) has no listAccounts, and serves only a registered
    account. Raises TransientError when unreachable, AdapterError when not registered."""
    version = (await rpc.call("version") or {}).get("version", "?")
    try:
        accounts = await rpc.call("listAccounts")
    except SignalCliError as exc:
        if exc.code != METHOD_NOT_FOUND:
            raise
        return f"{rpc.account} (signal-cli {version}, single-account daemon)"
    numbers = [a.get("number") for a in accounts or [] if isinstance(a, Mapping)]
    if rpc.account not in numbers:
        raise InvalidToken(
            f"{rpc.account} is not registered with signal-cli at {rpc.url} "
            f"(it has: {', '.join(str(n) for n in numbers) or 'no accounts'})"
        )
    return f"{rpc.account} (signal-cli {version})"
