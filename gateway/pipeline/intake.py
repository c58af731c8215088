"""Intake: every inbound message goes authorise -> addressed -> dedupe -> key -> commit to
the inbox, then to the worker as a tracked task. `Router` is the pipeline's face: it builds
the shared `Services`, the worker, the outbox and recovery, and is what adapters, the app
and the CLI hold.

Turns are serialised per session key (in arrival order) and run concurrently across keys.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway import faults, pairing, session_commands
from gateway.agent.base import Agent
from gateway.commands import CommandRegistry, builtin_commands, parse_command
from gateway.errors import NotAccepted
from gateway.index import IndexEntry, RouteIndex
from gateway.messages import InboundMessage
from gateway.ops.metrics import Metrics
from gateway.pipeline.inflight import InFlight
from gateway.pipeline.outbox import Outbox
from gateway.pipeline.recovery import Recovery
from gateway.pipeline.worker import Worker
from gateway.reset import Resetter
from gateway.reset.policy import PolicySet, decide
from gateway.services import RouterSettings, Sender, Services, TurnEvents
from gateway.session_keys import SessionKey
from gateway.sessions import SessionManager
from gateway.topology.base import Topology
from gateway.topology.coordinator import LocalCoordinator
from gateway.topology.local import LocalTopology
from gateway.topology.routes import entry_from_route
from gateway.turns import user_message
from gateway.vocab import ChatType
from state import OPEN_STATES, BeginPlan, SessionNotFound, StateError, Store, UnstorableData

log = logging.getLogger("gateway.router")

REFUSAL = "Sorry, you are not authorised to use this bot."


def begins_in(
    policies: PolicySet | None,
    clock: Callable[[], float],
    route: Mapping[str, Any],
    inbox_id: int,
) -> str | None:
    """Replicas: may the turn of a message whose accept just took its key's lease begin in
    the same commit, and in which session? Its route's own live session, when the row is
    the key's only open one, no dead runner's reply waits, no notice is owed and no reset
    is due (what the worker would decide first, decided on the route the take read under
    the lease, whose `jobs` are the session's live jobs); else None, and the turn begins as
    usual. Runs inside a transaction (the writer calls it): no awaits, no shared state, a
    function of the route row, the reset policies and the clock."""
    try:
        if [int(r["id"]) for r in route["open"]] != [inbox_id] or route.get("unsent"):
            return None
        if not (
            route.get("session_id")
            and route.get("route_found")
            and route.get("route_ended") is None
        ) or route.get("pending_notice"):
            return None
        entry = entry_from_route(route)
        if entry is None:
            return None
        if policies is not None:
            policy = policies.for_chat(entry.platform, entry.chat_type)
            live = bool(route.get("jobs"))
            if decide(entry.updated_at, clock(), live, policy).reason is not None:
                return None
        return entry.session_id
    except Exception as exc:  # never fail the accept over it: the turn begins later
        log.warning("could not decide an early begin: %s", exc)
        return None


class Router:
    """Builds the shared `Services` (or is given its parts) and routes each message."""

    def __init__(
        self,
        db: Store,
        index: RouteIndex,
        agent: Agent,
        send: Sender,
        settings: RouterSettings | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        events: TurnEvents | None = None,
        *,
        coordinator: LocalCoordinator | None = None,
        resetter: Callable[[Services], Resetter] | None = None,
        topology: Topology | None = None,
    ) -> None:
        """`topology`: where keys' work runs (gateway.wiring picks it); without one, one
        daemon's, on `index` and `coordinator`."""
        topology = topology or LocalTopology(db, index, coordinator)
        self.services = Services.create(
            db, index, agent, send, settings, metrics, clock, topology.coordinator, events
        )
        self.commands: CommandRegistry = builtin_commands()
        session_commands.register(self.commands)
        self.resetter = resetter(self.services) if resetter is not None else None
        self._refused: set[tuple[str, str]] = set()
        self._paired = pairing.PairedUsers(db)  # the allowlist's pairing approvals
        self._accepting = True
        self._topology = topology
        if self.resetter is not None:
            # replicas: a reset whose replica died before writing the route back is still
            # announced
            topology.use_reset_notice(self.resetter.notice_for)
        self._begin_plan = self.begin_plan  # bound once: the accept may ask it per message
        self._flight = flight = InFlight()
        self._inflight = flight.running
        self._pending = flight.pending
        outbox = Outbox(self.services, topology)
        self._worker = worker = Worker(
            self.services, self.commands, self.resetter, flight, outbox, topology
        )
        self._recovery = Recovery(self.services, flight, worker, outbox, topology)
        self._run = worker.run
        self.key_for = worker.key_for
        self.describe_reset = worker.describe_reset
        self.entry_for = worker.entry_for

    # --- what other parts read --------------------------------------------------------

    @property
    def settings(self) -> RouterSettings:
        return self.services.settings

    @settings.setter
    def settings(self, new: RouterSettings) -> None:
        self.services.settings.update(new)  # the same object everyone holds

    @property
    def sessions(self) -> SessionManager:
        return self.services.sessions

    @property
    def clock(self) -> Callable[[], float]:
        return self.services.clock

    @property
    def last_error(self) -> str | None:
        return self.services.metrics.last_error

    @property
    def inflight(self) -> int:
        return len(self.services.tasks)

    def live_jobs(self, session_id: str) -> list[str]:
        return self.services.coordinator.live_jobs(session_id)

    # --- intake --------------------------------------------------------------------------

    async def handle(self, msg: InboundMessage) -> None:
        """Called by adapters (their `emit`). Returns once the message is committed to the
        inbox (or decided: not for us, a duplicate), then runs the turn as a tracked task;
        raises NotAccepted when it could not be stored, so the adapter does not acknowledge
        it and the platform delivers it again."""
        s = self.services
        src = msg.source
        s.metrics.messages_in.inc(platform=src.platform)
        if not self._accepting:
            s.metrics.dropped.inc(reason="shutting_down")
            s.signals.ended(msg, "shutting_down")
            raise NotAccepted("the gateway is shutting down", "shutting_down")
        if not self._authorised(msg) and not await self._admit_stranger(msg):
            s.signals.ended(msg, "unauthorised")
            return
        if not msg.mentioned:
            s.metrics.dropped.inc(reason="not_addressed")
            s.signals.ended(msg, "not_addressed")
            return
        seen_key = None
        if msg.platform_message_id is not None:
            seen_key = (src.platform, src.chat_id, msg.platform_message_id)
            if s.coordinator.seen(seen_key):
                s.metrics.dropped.inc(reason="duplicate")
                s.signals.ended(msg, "duplicate")
                return
        key = self.key_for(msg)
        fast = self._idle_entry(msg, key)
        if fast is not None:
            entry, release = fast
            try:
                inbox_id, state, new, begun = await s.db.accept_and_begin(
                    src.platform,
                    src.chat_id,
                    msg.platform_message_id,
                    msg.as_payload(),
                    entry.session_id,
                    user_message(msg, key),
                    last=s.settings.history_messages,
                )
            except SessionNotFound:  # deleted under the daemon: the slow path starts anew
                release()
            except StateError as exc:
                release()
                self._refuse(msg, exc)
                return
            except BaseException:
                release()
                raise
            else:
                if begun is not None:  # new: the turn is under way, the lock is its
                    if seen_key is not None:
                        s.coordinator.remember(seen_key)
                    faults.point("after_inbox_commit")
                    self._run(msg, inbox_id, (key, entry, begun, release))
                    return
                release()
                self._after_accept(msg, seen_key, inbox_id, state, new, key)
                return
        k = key.format()
        # While this message commits, no later message of the key may take the fast path
        # past it: the key's lock may come free meanwhile (its turn ends, recovery stops
        # holding), and a fast path would take it first. `Worker.run` counts the turn
        # itself before this count goes.
        self._pending[k] = self._pending.get(k, 0) + 1
        try:
            # the key's lease may come with the commit when the key is idle here (not while
            # start-up recovery holds turns: the lease would wait with them), and a plain
            # message's turn may begin in it (see begin_plan)
            inbox_id, state, new, stored = await self._topology.accept(
                k, key, msg, lease=self._flight.held is None, begin=self._begin_plan
            )
            if stored is not None:  # new, taken and begun: the turn goes on from there
                if seen_key is not None:
                    s.coordinator.remember(seen_key)
                faults.point("after_inbox_commit")
                self._run(msg, inbox_id, stored=stored, key=key)
                return
            self._after_accept(msg, seen_key, inbox_id, state, new, key)
        except StateError as exc:
            self._refuse(msg, exc)
        finally:
            self._flight.unpend(k)

    def begin_plan(self, msg: InboundMessage, key: SessionKey) -> BeginPlan | None:
        """What a topology that takes a key's lease within the accept's commit needs to
        begin the turn in the same commit (the user's message, the history's length and
        `begins_in`), for a plain message while start-up recovery holds no turns."""
        if self._flight.held is not None or parse_command(msg.text) is not None:
            return None
        s = self.services
        resetter = self.resetter
        test = functools.partial(
            begins_in,
            resetter.policies if resetter is not None else None,
            resetter.clock if resetter is not None else s.clock,
        )
        return BeginPlan(user_message(msg, key), s.settings.history_messages, test)

    def _idle_entry(
        self, msg: InboundMessage, key: SessionKey
    ) -> tuple[IndexEntry, Callable[[], None]] | None:
        """The fast path's test: a plain message to a key nobody is working on (and not
        while start-up recovery holds turns), whose session exists and is not due a reset
        or a notice. Then the key's lock is taken now
        (the entry cannot change under it) and the message can be stored in its session in
        the same commit that takes it: (the entry, the lock's release), else None."""
        s = self.services
        k = key.format()
        if self._pending.get(k) or self._flight.held is not None:
            return None
        if parse_command(msg.text) is not None:
            return None
        # (None where a key cannot be taken without waiting: a replica's lease)
        release = self._topology.try_lock(k)
        if release is None:
            return None
        entry = s.index.get(k)
        if (
            entry is None
            or s.coordinator.has_notice(k)
            or (self.resetter is not None and self.resetter.due_now(entry))
        ):
            release()  # (nothing awaited while it was held)
            return None
        return entry, release

    def _refuse(self, msg: InboundMessage, exc: StateError) -> None:
        """The inbox could not take `msg`: NotAccepted, so the platform delivers it again;
        but a value the store can never hold is dropped (acknowledged, never redelivered)."""
        s = self.services
        s.metrics.errors.inc(kind="inbox")
        s.metrics.last_error = f"inbox: {type(exc).__name__}: {exc}"
        if isinstance(exc, UnstorableData):
            log.error("dropped a %s message the store can never hold: %s", msg.source.platform, exc)
            s.metrics.dropped.inc(reason="unstorable")
            s.signals.ended(msg, "unstorable")
            return
        log.error("could not commit a %s message to the inbox: %s", msg.source.platform, exc)
        s.signals.ended(msg, "not_accepted")
        raise NotAccepted(f"the message could not be stored: {exc}") from exc

    def _after_accept(
        self,
        msg: InboundMessage,
        seen_key: tuple[str, str, str] | None,
        inbox_id: int,
        state: str,
        new: bool,
        key: SessionKey | None = None,
    ) -> None:
        s = self.services
        if seen_key is not None:
            s.coordinator.remember(seen_key)
        if not new and (state not in OPEN_STATES or inbox_id in self._inflight):
            s.metrics.dropped.inc(reason="duplicate")
            s.signals.ended(msg, "duplicate")
            return
        faults.point("after_inbox_commit")
        # new, or a redelivery of a turn a crash left unfinished (and not running): run it
        if self._flight.held is not None:  # after what a crash left in the same chats: see recover
            self._flight.held[inbox_id] = msg
            self._inflight.add(inbox_id)
            return
        self._run(msg, inbox_id, key=key)

    def _authorised(self, msg: InboundMessage) -> bool:
        """The config's allowlist (and admins) let the sender in."""
        rules = self.services.settings.access.get(msg.source.platform)
        return rules is None or rules.allows(msg.source.user_id)

    async def _admit_stranger(self, msg: InboundMessage) -> bool:
        """A sender the config does not list: let in when paired (the store's allowlist);
        else dropped, and in a DM refused once, offered a pairing code, or ignored."""
        s = self.services
        src = msg.source
        try:
            if src.user_id is not None and await self._paired.allows(src.platform, src.user_id):
                return True
        except StateError as exc:  # the store cannot say: not let in (this message only)
            log.warning(
                "pairing lookup for user %s on %s failed: %s", src.user_id, src.platform, exc
            )
        s.metrics.dropped.inc(reason="unauthorised")
        log.info("unauthorised user %s on %s (%s)", src.user_id, src.platform, src.chat_type)
        if src.chat_type != ChatType.DM:
            return False
        if s.settings.unknown_dm == "refuse":
            marker = (src.platform, src.user_id or src.chat_id)
            if marker not in self._refused:  # one refusal per user, not one per message
                self._refused.add(marker)
                s.tasks.start(s.replies.reply(msg, None, REFUSAL), "refusal")
        elif s.settings.unknown_dm == "pair" and src.user_id is not None:
            rules = s.settings.pairing
            try:
                code = await pairing.offer(
                    s.db, rules, src.platform, src.user_id, src.user_name, src.chat_id, s.clock()
                )
            except StateError as exc:
                log.warning("no pairing code for user %s on %s: %s", src.user_id, src.platform, exc)
                code = None
            if code is not None:
                log.info("pairing code offered to user %s on %s", src.user_id, src.platform)
                text = pairing.code_message(code, rules.ttl_s)
                s.tasks.start(s.replies.reply(msg, None, text), "pairing code")
        return False

    # --- recovery and shutdown -----------------------------------------------------------

    async def hold_until_recovered(self) -> None:
        """Called before the adapters start: see Recovery.hold_until_recovered."""
        await self._recovery.hold_until_recovered()

    async def recover(self, max_age_s: float) -> tuple[int, int]:
        """The start-up recovery, and on replicas the takeover scan: see Recovery.recover."""
        return await self._recovery.recover(max_age_s)

    # --- shutdown ------------------------------------------------------------------------

    def stop_intake(self) -> None:
        self._accepting = False

    async def drain(self, budget_s: float) -> int:
        """Let in-flight turns finish within the budget, then cancel the rest.
        Returns how many were cancelled."""
        return await self.services.tasks.drain(budget_s)
