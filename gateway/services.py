"""The services the router, the turn runner, commands, the Resetter and the handoff watcher
share, handed to each explicitly as one `Services` object.

It owns the router's settings (live: a reload updates them in place), how a reply reaches
the chat (`Replier`), what the platform side hears about a message besides replies
(`TurnSignals`) and the registry of tasks the daemon drains on shutdown (`TaskSet`).
It knows nothing of routing, commands or resets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar

from gateway.adapters import replies_in_request
from gateway.agent.base import Agent
from gateway.deadlines import Deadlines
from gateway.errors import SEND_REFUSED, send_failure
from gateway.index import RouteIndex
from gateway.messages import (
    HeldRef,
    InboundMessage,
    OutboundMessage,
    RefusedRef,
    SentRef,
    SetOutLate,
    TokenUsage,
    set_out_late,
)
from gateway.ops.metrics import Metrics
from gateway.pairing import PairingRules
from gateway.session_keys import KeySettings, SessionKey, SessionSource
from gateway.sessions import SessionManager
from gateway.topology.coordinator import Coordinator, LocalCoordinator
from state import Store

log = logging.getLogger("gateway.router")  # replies and drains log as the router did
T = TypeVar("T")

# ahead of a chat's next reply, once, after a reply to it expired undelivered in the outbox
EXPIRY_NOTICE = (
    "Sorry, an earlier reply of mine could not be delivered in time (the chat service did "
    "not take it) and was given up. It is kept in this conversation; ask me again if it "
    "still matters."
)

Sender = Callable[[OutboundMessage], Awaitable[SentRef | None]]


@dataclass(frozen=True)
class AccessRules:
    """Who may talk to the agent on one platform."""

    allow_all: bool = False
    allowed: frozenset[str] = frozenset()
    admins: frozenset[str] = frozenset()

    def allows(self, user_id: str | None) -> bool:
        if self.allow_all:
            return True
        return user_id is not None and (user_id in self.allowed or user_id in self.admins)


@dataclass
class RouterSettings:
    keys: KeySettings = field(default_factory=KeySettings)
    access: Mapping[str, AccessRules] = field(default_factory=dict)
    unknown_dm: str = "refuse"
    pairing: PairingRules = field(default_factory=PairingRules)
    system_prompt: str | None = None
    history_messages: int = 200
    context_tokens: int = 128_000
    reply_tokens: int = 4_096
    turn_timeout_s: float = 300.0
    resend_unconfirmed: bool = False  # inbox.resend_unconfirmed_replies: at least once
    auto_title: bool = True  # agent.auto_title: ask the agent for a title after the first exchange

    def update(self, new: RouterSettings) -> None:
        """Take every value of `new`, in place, so every holder of this object sees them."""
        for f in fields(self):
            setattr(self, f.name, getattr(new, f.name))

    def is_admin(self, source: SessionSource) -> bool:
        rules = self.access.get(source.platform)
        return bool(rules and source.user_id is not None and source.user_id in rules.admins)


class TurnEvents(Protocol):
    """What the router tells the platform side about one inbound message, besides replies:
    that an agent turn for it is starting (show typing), and that the work on it is over,
    with the reason when it was dropped unanswered ("duplicate", "unauthorised", ...)."""

    def turn_started(self, msg: InboundMessage) -> None: ...

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None: ...


class TurnSignals:
    """Passes turn events on, if anyone listens; a failing listener is logged, never raised
    (a platform nicety must never break a turn)."""

    def __init__(self, events: TurnEvents | None = None) -> None:
        self.events = events

    def started(self, msg: InboundMessage) -> None:
        if self.events is not None:
            try:
                self.events.turn_started(msg)
            except Exception:
                log.exception("turn_started failed on %s", msg.source.platform)

    def ended(self, msg: InboundMessage, dropped: str | None) -> None:
        if self.events is not None:
            try:
                self.events.turn_ended(msg, dropped)
            except Exception:
                log.exception("turn_ended failed on %s", msg.source.platform)


class Backlog(Protocol):
    """The outbox's backlog as the reply path sees it (gateway.pipeline.backlog)."""

    def waiting(self, platform: str, chat_id: str) -> bool: ...

    async def owed_notice(self, platform: str, chat_id: str) -> bool: ...

    async def hold(
        self,
        out: OutboundMessage,
        *,
        inbox_id: int | None = None,
        received: float | None = None,
        failure: BaseException | None = None,
        due: float | None = None,
    ) -> None: ...

    async def refuse(self, out: OutboundMessage, inbox_id: int, exc: BaseException) -> bool: ...

    def reply_horizon(self, platform: str, due: float, received: float | None) -> float: ...

    async def expire_unsent(self, inbox_id: int, platform: str, chat_id: str) -> None: ...


class Replier:
    """Sends a reply to the chat a message came from and counts it; a failed send is
    logged and counted, never raised (the turn is stored either way). With the outbox's
    backlog, a reply to a chat that has undelivered ones waits behind them, and one whose
    send fails transiently is held there until it is delivered or expires (HeldRef)."""

    def __init__(self, send: Sender, metrics: Metrics) -> None:
        self.send = send
        self.metrics = metrics
        self.backlog: Backlog | None = None  # set by the daemon (gateway.app)

    async def reply(
        self,
        msg: InboundMessage,
        session_id: str | None,
        text: str,
        key: SessionKey | None = None,
        error: str | None = None,
        notice: bool = False,
        dedupe_key: str | None = None,
        resend: bool = False,
        since: float | None = None,
        usage: TokenUsage | None = None,
        inbox_id: int | None = None,
        due: float | None = None,
    ) -> SentRef | None:
        """Send; the platform's reference, a HeldRef when the outbox holds it, or None
        when the send failed for good (logged, counted). `dedupe_key` names the reply
        across sends; `resend` marks a start-up resend; `inbox_id`: the inbox row whose
        turn's reply this is (its row records the reply's fate); `due`: when the reply was
        first to go (a resend after a restart: its expiry counts from then)."""
        src = msg.source
        out = OutboundMessage(
            platform=src.platform,
            chat_id=src.chat_id,
            text=text,
            thread_id=src.thread_id,
            reply_to=msg.platform_message_id,
            session_id=session_id,
            session_key=key.format() if key else None,
            error=error,
            notice=notice,
            dedupe_key=dedupe_key,
            resend=resend,
            since=since,
            usage=usage,
        )
        backlog = self.backlog if not replies_in_request(src.platform) else None
        if backlog is not None:
            if backlog.waiting(src.platform, src.chat_id):
                return await self._hold(backlog, out, msg, inbox_id, None, due)
            if await backlog.owed_notice(src.platform, src.chat_id):  # the platform is up
                await self._notice(msg, session_id, key)
        try:
            ref = await self.send(out)
            self.metrics.messages_out.inc(platform=src.platform)
            return ref
        except SetOutLate:
            raise  # nothing left: the turn asks its lease first (gateway/turns.py)
        except Exception as exc:
            if set_out_late(exc):  # wrapped by a client library: the same
                raise SetOutLate() from exc
            self.metrics.last_error = f"send: {type(exc).__name__}: {exc}"
            self.metrics.errors.inc(kind="send")
            log.error("sending to %s chat %s failed: %s", src.platform, src.chat_id, exc)
            if backlog is None:
                return None
            if send_failure(exc)[0] != SEND_REFUSED:
                return await self._hold(backlog, out, msg, inbox_id, exc, due)
            if inbox_id is not None and await backlog.refuse(out, inbox_id, exc):
                return RefusedRef(out.platform, out.chat_id)
            return None

    async def _hold(
        self,
        backlog: Backlog,
        out: OutboundMessage,
        msg: InboundMessage,
        inbox_id: int | None,
        failure: BaseException | None,
        due: float | None,
    ) -> SentRef | None:
        try:
            await backlog.hold(
                out,
                inbox_id=inbox_id,
                received=msg.received_at or None,
                failure=failure,
                due=due,
            )
        except Exception as exc:  # the store refused: logged, and the reply is not kept
            log.error("the outbox could not keep a reply to %s: %s", out.platform, exc)
            return None
        return HeldRef(out.platform, out.chat_id)

    async def _notice(
        self, msg: InboundMessage, session_id: str | None, key: SessionKey | None
    ) -> None:
        """The expiry notice, ahead of the chat's next reply."""
        src = msg.source
        out = OutboundMessage(
            src.platform,
            src.chat_id,
            EXPIRY_NOTICE,
            thread_id=src.thread_id,
            session_id=session_id,
            session_key=key.format() if key else None,
            notice=True,
        )
        try:
            await self.send(out)
            self.metrics.messages_out.inc(platform=src.platform)
        except Exception as exc:
            log.warning(
                "the expiry notice to %s chat %s failed: %s", src.platform, src.chat_id, exc
            )


class TaskSet:
    """The tasks message handling started (turns, refusals, titles, background jobs), so
    shutdown can let them finish within a budget."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task: object) -> bool:
        return task in self._tasks

    async def drain(self, budget_s: float) -> int:
        """Let the tasks finish within the budget, then cancel the rest; how many were
        cancelled."""
        pending = set(self._tasks)
        if not pending:
            return 0
        done, still = await asyncio.wait(pending, timeout=budget_s)
        for task in still:
            task.cancel()
        if still:
            await asyncio.gather(*still, return_exceptions=True)
            log.warning("cancelled %d turn(s) still running after %.1fs", len(still), budget_s)
        return len(still)


@dataclass(frozen=True)
class Services:
    db: Store
    index: RouteIndex
    sessions: SessionManager
    coordinator: Coordinator
    agent: Agent
    settings: RouterSettings
    metrics: Metrics
    replies: Replier
    signals: TurnSignals
    tasks: TaskSet
    deadlines: Deadlines  # the agent's time limit, on every turn
    clock: Callable[[], float]

    @classmethod
    def create(
        cls,
        db: Store,
        index: RouteIndex,
        agent: Agent,
        send: Sender,
        settings: RouterSettings | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        coordinator: Coordinator | None = None,
        events: TurnEvents | None = None,
    ) -> Services:
        settings = settings or RouterSettings()
        metrics = metrics or Metrics()
        sessions = SessionManager(
            db,
            index,
            agent,
            model=agent.model,
            system_prompt=settings.system_prompt,
            context_tokens=settings.context_tokens,
            clock=clock,
        )
        return cls(
            db=db,
            index=index,
            sessions=sessions,
            coordinator=coordinator or LocalCoordinator(),
            agent=agent,
            settings=settings,
            metrics=metrics,
            replies=Replier(send, metrics),
            signals=TurnSignals(events),
            tasks=TaskSet(),
            deadlines=Deadlines(),
            clock=clock,
        )
