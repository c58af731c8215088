"""The Adapter interface, its capabilities, and what every adapter shares: sending with
retry_after honoured and within a reply's send-by time, and starting under the daemon (`SupervisedStart`: an unreachable platform is retried, a refused
credential stops that adapter alone)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from gateway.adapters.kit.lifecycle import failed
from gateway.errors import ConfigError, InvalidToken, RetryAfter, TransientError
from gateway.messages import (
    ONE_TRY,
    SEND_BY,
    InboundMessage,
    OutboundMessage,
    SentRef,
    SetOutLate,
    ThreadRef,
    set_out_late,
)
from gateway.sections import PlatformSettings, SecretNeed
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState

T = TypeVar("T")
Emit = Callable[[InboundMessage], Awaitable[None]]


CANCEL_AGAIN_S = 1.0  # stop_task: how long a cancelled task has before it is cancelled again


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel a loop of the adapter's and wait until it has ended, whatever it raised (it
    logs its own failures). A task that is still running a moment after its cancel is
    cancelled again, until it ends: a cancel can be swallowed on its way (Python 3.11's
    asyncio.wait_for returns an inner result that completed as the cancel came, and a
    client library may catch it), and the loop would then go on, into a wait of an hour."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_AGAIN_S)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


class Adapter(Protocol):
    """One chat platform: emits InboundMessage, delivers OutboundMessage.

    Inbox before ack: `await emit(msg)` returns once the message is committed (or decided:
    a duplicate, not allowed, not addressed), and raises `NotAccepted` when it could not be
    stored. An adapter acknowledges a message to its platform (a webhook's 2xx, a stream's
    cursor, an IMAP flag) only after `emit` returned, and on `NotAccepted` answers so the
    platform delivers it again (503, cursor left where it was)."""

    platform: ClassVar[str]

    async def start(self, emit: Emit) -> None: ...

    async def send(self, msg: OutboundMessage) -> SentRef: ...

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None: ...

    async def stop(self) -> None: ...

    def health(self) -> dict[str, object]: ...


Route = Callable[[Any], Awaitable[Any]]  # an aiohttp handler served by the api adapter


class Cursors(Protocol):
    """Where an adapter keeps its place in a platform's stream across restarts (a Matrix
    `since` token, the last IMAP UID, a Telegram offset), stored in the gateway's store.
    An adapter that wants one defines `use_cursors(cursors)`; the daemon calls it before
    `start`. Names are the adapter's own; values are short strings."""

    async def get(self, name: str) -> str | None: ...

    async def set(self, name: str, value: str) -> None: ...


# --- capabilities: what an adapter may do beyond the Adapter interface ----------------
#
# An adapter declares each capability it has by naming its Protocol among its bases
# (`class MatrixAdapter(Typing, UsesCursors, UsesShards, HomeIds)`); the core asks with
# isinstance / issubclass, never by probing for attributes.


@runtime_checkable
class TurnHooks(Protocol):
    """Told when the core is done with a message of its platform, whatever the end
    (`dropped` names why no reply came: a duplicate, a refused user...)."""

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None: ...


@runtime_checkable
class Typing(TurnHooks, Protocol):
    """Shows typing while the core runs a turn: from turn_started to the reply or
    turn_ended."""

    def turn_started(self, msg: InboundMessage) -> None: ...


@runtime_checkable
class UsesCursors(Protocol):
    """Keeps its place in the platform's stream in the gateway's store (see Cursors); the
    daemon hands it the cursors before `start`."""

    def use_cursors(self, cursors: Cursors) -> None: ...


@runtime_checkable
class UsesShards(Protocol):
    """Among replicas, receives only while this replica owns the platform's receiving
    connection (a ShardLedger of gateway.shards); the daemon hands it the ledger before
    `start`."""

    def use_shards(self, ledger: Any) -> None: ...


@runtime_checkable
class Outbound(Protocol):
    """Can send without the daemon (`switchboard send`): `open_outbound` readies it for
    sending only, receiving nothing; `stop` closes it."""

    async def open_outbound(self) -> Any: ...

    async def stop(self) -> None: ...


@runtime_checkable
class HomeIds(Protocol):
    """Its chat ids may hold ":" (a Matrix room, a Teams conversation): it says how a
    configured home channel splits into chat and thread."""

    @classmethod
    def split_home(cls, value: str) -> tuple[str, str | None]: ...


@runtime_checkable
class SetupSteps(Protocol):
    """Tells `switchboard setup` what to do in the platform's console."""

    @classmethod
    def setup_steps(cls, settings: Any) -> list[str]: ...


@dataclass(frozen=True)
class LoginResult:
    """What a terminal login yields: `secrets` maps the section's `*_env` keys to values
    (written to the secrets file under the variables they name), `settings` maps its other
    keys to values for config.yaml, `notes` are lines for the person who logged in."""

    secrets: Mapping[str, str]
    settings: Mapping[str, Any] = field(default_factory=dict)
    notes: Sequence[str] = ()


@runtime_checkable
class Login(Protocol):
    """Logs its bot in from the terminal (`switchboard login <platform>`, a QR code to
    scan, say) instead of taking a token pasted from a console."""

    @classmethod
    async def login(
        cls, settings: Any, base_url: str | None, timeout_s: float, out: Any
    ) -> LoginResult: ...


@runtime_checkable
class ReplicaLimits(Protocol):
    """Has a mode that several replicas cannot share (Telegram's polling): names its keys,
    so such a config is refused with exit 78."""

    @classmethod
    def replica_problems(cls, settings: Any, replicas: int) -> list[ConfigError]: ...


@runtime_checkable
class Listens(Protocol):
    """Serves HTTP itself (the api adapter): where, for the error when the port is taken."""

    host: str
    port: int


class PlatformAdapter(Adapter, Protocol):
    """A chat platform's adapter with everything the core needs to know about the
    platform: its config section, its secrets, how it is built and checked, and how a
    handoff addresses its chats. The registry (gateway.adapters) hands these out by name.

    Optional: `idempotent_replies: ClassVar[bool] = True` declares that a send carrying an
    `OutboundMessage.dedupe_key` already sent is never shown twice in the chat; the outbox
    then sends such replies again after a crash (exactly once instead of at most once).
    Optional: `reply_window_s: ClassVar[float]` declares how long after the user's message
    the platform accepts a reply (WhatsApp's 24 hours): the outbox lets a reply it holds
    expire then.
    Optional: `drain_per_second: ClassVar[float]` declares how fast the outbox sends the
    platform's backlog after an outage (under its published limit for a bot; 5 without).
    Optional: `replies_in_request: ClassVar[bool] = True` declares that each reply is the
    response to its own request (the HTTP API): no reply of the chat can overtake another,
    and a repeated request reads its answer from the store (see
    gateway.adapters.replies_in_request).
    Optional: `cursors_to_send: ClassVar[bool] = True` declares that a send needs what the
    adapter keeps per chat among its cursors (Weixin's reply tokens): `switchboard send`
    without the daemon opens the store and hands the adapter its cursors before
    `open_outbound`.
    Further capabilities are the Protocols above (Typing, UsesCursors, HomeIds,
    ReplicaLimits...), declared among the adapter's bases."""

    settings: ClassVar[type[PlatformSettings]]
    library_loggers: ClassVar[tuple[str, ...]]  # quieted to WARNING with the daemon's own

    @classmethod
    def secrets_needed(cls, settings: Any) -> list[SecretNeed]:
        """The secrets an enabled section needs (read from the environment at load)."""
        ...

    @classmethod
    def problems(cls, settings: Any, api_enabled: bool) -> list[ConfigError]:
        """How an enabled section's keys fit together (secrets are checked apart)."""
        ...

    @classmethod
    def from_config(cls, settings: Any, secrets: Mapping[str, str]) -> PlatformAdapter:
        """The adapter for an enabled section; `secrets` maps its `*_env` keys to values."""
        ...

    def routes(self) -> Mapping[str, Route]:
        """Paths the api adapter's HTTP server serves for this platform (webhooks): a key
        is a path (served for POST) or "METHOD path" (e.g. "GET /x/webhook")."""
        ...

    @classmethod
    async def check_credentials(cls, settings: Any, secrets: Mapping[str, str]) -> tuple[bool, str]:
        """Ask the platform, through its client library, who the token belongs to:
        (accepted, the bot's name or why not)."""
        ...

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """ "dm" or "group" for a configured home channel id."""
        ...

    @classmethod
    def thread_source(cls, thread: ThreadRef) -> SessionSource:
        """Where a session handed off into `thread` lives, as a message there will say."""
        ...


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        base = min(self.max_s, self.initial_s * self.factor**attempt)
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)


DEFAULT_BACKOFF = Backoff()


async def call_with_retry(
    call: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff = DEFAULT_BACKOFF,
    attempts: int = 6,
    max_retry_after_s: float = 300.0,
    log: logging.Logger | None = None,
) -> T:
    """Run a platform call: wait out RetryAfter (never dropping the message), back off on
    transient errors, and give up at once on an invalid token. In the outbox's drain
    (ONE_TRY) the call is tried once: the outbox spaces its tries itself; a retry that
    would start past the task's SEND_BY raises the failure instead (the outbox keeps it)."""
    if ONE_TRY.get():
        return await _unwrapped_late(call)
    for attempt in range(attempts):
        try:
            return await _unwrapped_late(call)
        except InvalidToken:
            raise
        except RetryAfter as exc:
            wait = min(exc.seconds, max_retry_after_s)
            if _past_send_by(wait):
                raise  # the retry would set out late: the outbox keeps the reply instead
            if log:
                log.warning("rate limited; waiting %.1fs before retrying", wait)
            if not await _waited(wait):
                raise  # the daemon is stopping: the outbox keeps the reply for the next start
        except TransientError as exc:
            if attempt == attempts - 1:
                raise
            wait = backoff.delay(attempt)
            if _past_send_by(wait):
                raise  # the retry would set out late: the outbox keeps the reply instead
            if log:
                log.warning("transient error (%s); retrying in %.1fs", exc, wait)
            if not await _waited(wait):
                raise  # the daemon is stopping: the outbox keeps the reply for the next start
    return await _unwrapped_late(call)


_stopping = [False]  # end_retries: the daemon is stopping


def end_retries(stopping: bool = True) -> None:
    """The daemon is stopping (True; False: running). A call_with_retry waiting for its
    next try then raises the failure it met at once: a reply's send ends known unsent, and
    the outbox keeps it for the next start, rather than the stop's drain cancelling it in
    the wait (on a platform that cannot deduplicate it would be left unconfirmed)."""
    _stopping[0] = stopping


async def _waited(wait: float) -> bool:
    """Sleep `wait` seconds; False, at once, if the daemon begins to stop meanwhile."""
    end = time.monotonic() + wait
    while not _stopping[0]:
        left = end - time.monotonic()
        if left <= 0:
            return True
        await asyncio.sleep(min(left, 0.1))
    return False


def _past_send_by(wait: float) -> bool:
    """Would a retry after `wait` start past the sending task's SEND_BY (a replica's turn)?
    Then the failure is raised as it came: the reply was not sent, and the outbox holds it,
    rather than the retry stopping unsent (SetOutLate) and the turn sending it again."""
    by = SEND_BY.get()
    return by is not None and time.monotonic() + wait > by


async def _unwrapped_late(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`; a SetOutLate a client library wrapped (in a connection error, say) comes
    out as itself, so it is neither retried nor taken for a failed send."""
    try:
        return await call()
    except SetOutLate:
        raise
    except Exception as exc:
        if not set_out_late(exc):
            raise
        raise SetOutLate() from exc


async def check_send_by(*_args: Any) -> None:
    """Raise SetOutLate when the sending task's SEND_BY has passed: for an adapter to call
    at the last await before its reply goes out (the HTTP sessions' hooks below call it)."""
    by = SEND_BY.get()
    if by is not None and time.monotonic() > by:
        raise SetOutLate()


def send_by_trace() -> Any:
    """An aiohttp TraceConfig for an adapter's HTTP session that raises SetOutLate when a
    request would leave after the sending task's SEND_BY: checked when the request gets
    its connection (new or reused), and again just before its body's first chunk is
    written. That last check is the one that matters: aiohttp buffers the headers and
    writes them with the body from a task of its own, which on Python before 3.12 first
    runs an event-loop pass after the connection was had; a replica stopped in that pass
    would otherwise wake and write a request it had checked before stopping. From the
    chunk's check to the socket's write there is no await. A replica that stood still
    between a reply's lease check and its request leaving finds out there, not after
    sending it."""
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(check_send_by)
    trace.on_connection_reuseconn.append(check_send_by)
    trace.on_request_chunk_sent.append(check_send_by)
    return trace


def send_by_transport() -> Any:
    """send_by_trace for an adapter whose client library speaks httpx (Mattermost's driver
    takes a transport): every request carries httpcore's trace hook, which raises SetOutLate
    when the request's headers are about to be written after the sending task's SEND_BY."""
    import httpx

    class SendByTransport(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            request.extensions = {**request.extensions, "trace": _trace_send_by}
            return await super().handle_async_request(request)

    return SendByTransport()


async def _trace_send_by(event: str, _info: Any) -> None:
    if event.endswith(".send_request_headers.started"):
        await check_send_by()


# --- starting an adapter under the daemon ----------------------------------------------
#
# The same rule for every platform. A start that fails on the network (connection refused,
# a DNS failure, a timeout, a 5xx: `start_failure` tells) leaves the adapter `retrying`: a
# named task starts it again with capped backoff while the daemon and the other adapters
# run, one log line per attempt. A credential the platform refused stops that adapter
# alone, with one line naming its config key. Anything else is a bug and fails the start as
# before. /health shows the state and the last error. Adapters only raise typed errors.

start_log = logging.getLogger("gateway.adapters")

# first retry after about 2 s, then 4, 8 ... at most about a minute apart
START_BACKOFF = Backoff(initial_s=2.0, factor=2.0, max_s=60.0, jitter=0.2)


class StartFailure(StrEnum):
    NETWORK = "network"  # the platform could not be reached: retried
    CREDENTIALS = "credentials"  # the platform refused our credentials: that adapter stops


def start_failure(exc: BaseException) -> StartFailure | None:
    """What kind of start failure `exc` is, from the typed errors along its chain of causes
    (a client library's network error wraps the OSError it met); None for anything else."""
    import ssl

    import aiohttp

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, InvalidToken):
            return StartFailure.CREDENTIALS
        if isinstance(cause, ssl.SSLCertVerificationError):
            return None  # the configured server is not who it says: waiting will not help
        if isinstance(cause, (TransientError, RetryAfter, OSError, TimeoutError)):
            return StartFailure.NETWORK  # refused, DNS (gaierror), reset, timed out
        status = getattr(cause, "status", None)  # aiohttp's, discord.py's HTTP errors
        if isinstance(status, int) and status >= 500:
            return StartFailure.NETWORK
        if isinstance(cause, aiohttp.ClientConnectionError):
            return StartFailure.NETWORK  # a dropped connection, a failed TLS handshake
        cause = cause.__cause__ or cause.__context__
    return None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


@dataclass
class SupervisedStart:
    """One platform adapter's start under the daemon: its first attempt, then the retries.
    `credential_keys` are the config keys naming its secrets (said when they are refused)."""

    adapter: Adapter
    credential_keys: Sequence[str] = ()
    backoff: Backoff = START_BACKOFF
    state: str | None = None  # retrying / failed: ...; None while the adapter's own holds
    last_error: str | None = None
    attempts: int = 0
    next_attempt_at: float | None = None  # time.time() of the next attempt, while retrying
    refused: bool = False  # the platform refused the credentials: stopped for good
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def platform(self) -> str:
        return self.adapter.platform

    async def start(self, emit: Emit) -> None:
        """The first attempt. Returns when the adapter runs, is retrying in the background,
        or was refused its credentials; raises what is neither (a bug)."""
        self.attempts = 1
        try:
            await self.adapter.start(emit)
        except Exception as exc:
            kind = start_failure(exc)
            if kind is None:
                raise
            if kind is StartFailure.CREDENTIALS:
                self._refused(exc)
                return
            self._unreachable(exc)
            self._task = asyncio.create_task(self._retry(emit), name=f"start:{self.platform}")

    async def _retry(self, emit: Emit) -> None:
        while True:
            await asyncio.sleep(max(0.0, (self.next_attempt_at or 0.0) - time.time()))
            with contextlib.suppress(Exception):  # what the failed attempt left open
                await self.adapter.stop()
            self.attempts += 1
            try:
                await self.adapter.start(emit)
            except Exception as exc:
                kind = start_failure(exc)
                if kind is StartFailure.NETWORK:
                    self._unreachable(exc)
                    continue
                if kind is StartFailure.CREDENTIALS:
                    self._refused(exc)
                else:  # a bug: retrying will not fix it, and the daemon keeps running
                    self.state, self.last_error = failed(type(exc).__name__), _one_line(exc)
                    self.next_attempt_at = None
                    start_log.exception(
                        "%s: the adapter failed to start; it is stopped", self.platform
                    )
                return
            self.state, self.next_attempt_at = None, None
            start_log.info("%s: connected on attempt %d", self.platform, self.attempts)
            return

    def _unreachable(self, exc: BaseException) -> None:
        self.state, self.last_error = AdapterState.RETRYING, _one_line(exc)
        wait = self.backoff.delay(self.attempts - 1)
        self.next_attempt_at = time.time() + wait
        start_log.warning(
            "%s: start attempt %d failed, the platform is unreachable: %s; the next attempt "
            "in about %.0fs (the rest of the gateway runs)",
            self.platform,
            self.attempts,
            self.last_error,
            wait,
            exc_info=exc if start_log.isEnabledFor(logging.DEBUG) else None,
        )

    def _refused(self, exc: BaseException) -> None:
        own = str(self.adapter.health().get("state") or "")
        self.refused = True
        self.state = own if own.startswith(AdapterState.FAILED) else failed("invalid credentials")
        self.last_error, self.next_attempt_at = _one_line(exc), None
        keys = ", ".join(self.credential_keys) or f"platforms.{self.platform}"
        start_log.error(
            "%s: %s; the %s adapter is stopped (the rest of the gateway runs)",
            keys,
            self.last_error,
            self.platform,
            exc_info=exc if start_log.isEnabledFor(logging.DEBUG) else None,
        )

    def health(self) -> dict[str, object]:
        out = dict(self.adapter.health())
        if self.state is None:
            return out
        out.update(state=self.state, last_error=self.last_error, start_attempts=self.attempts)
        if self.state == AdapterState.RETRYING and self.next_attempt_at is not None:
            left = max(0.0, self.next_attempt_at - time.time())
            out["next_attempt_in_seconds"] = round(left, 1)
        if self.refused and self.credential_keys:
            out["config_keys"] = list(self.credential_keys)
        return out

    async def stop(self) -> None:
        """End the retries (the adapter itself is stopped by its owner)."""
        task, self._task = self._task, None
        await stop_task(task)
