"""The router: every inbound message goes authorize -> dedupe -> key -> index entry ->
lazy reset -> command or agent turn -> reply.

Turns are serialised per session key (a second message arriving mid-turn waits its turn,
in arrival order) and run concurrently across keys. Running the agent is gateway.turns';
the locks and the redelivery memory are the coordinator's; the commands are
gateway.commands' and gateway.session_commands'.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway import faults, pairing, session_commands
from gateway.adapters import idempotent_replies
from gateway.agent.base import Agent
from gateway.commands import (
    CommandContext,
    CommandRegistry,
    builtin_commands,
    no_reset_policy,
    parse_command,
)
from gateway.coordinator import Coordinator
from gateway.errors import NotAccepted
from gateway.index import IndexEntry, RouteIndex
from gateway.leases import Lease, SharedCoordinator, Stored
from gateway.messages import InboundMessage
from gateway.ops.metrics import Metrics
from gateway.reset import Resetter
from gateway.routes import entry_from_route
from gateway.services import AccessRules, RouterSettings, Sender, Services, TurnEvents
from gateway.session_keys import SessionKey, build_key
from gateway.sessions import SessionManager
from gateway.turns import (
    APOLOGY,
    TurnProgress,
    agent_turn,
    mark_reply,
    may_send,
    reply_key,
    send_checked,
    user_message,
)
from gateway.vocab import ChatType
from state import (
    ANSWERED,
    DROPPED,
    OPEN_STATES,
    STARTED,
    LeaseLost,
    LiveSessionExists,
    SessionNotFound,
    StateError,
    Store,
    StoreUnavailable,
    UnstorableData,
    content_text,
)

__all__ = ["APOLOGY", "AccessRules", "Router", "RouterSettings", "Sender", "TurnEvents"]

log = logging.getLogger("gateway.router")

# A fast-path turn handed to its task: the key, its entry, begin_turn's result (the user's
# message id and the history) and the release of the key's lock, which the task now owns.
Begun = tuple[SessionKey, IndexEntry, tuple[int, list[dict[str, Any]]], Callable[[], None]]

STORAGE_APOLOGY = (
    "Sorry, I could not store your message just now; please send it again in a moment."
)
UNSTORABLE_APOLOGY = "Sorry, I cannot store that message: it holds text I cannot keep."
REFUSAL = "Sorry, you are not authorised to use this bot."


def too_old_apology(text: str) -> str:
    """For a message a crash left unanswered longer than recovery.max_age_seconds."""
    quoted = " ".join(text.split())
    if len(quoted) > 60:
        quoted = quoted[:57] + "..."
    return (f'Sorry, your message "{quoted}" arrived while the gateway was restarting and '
            "is too old to answer now; please send it again if it still matters.")  # fmt: skip


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
        coordinator: Coordinator | None = None,
        resetter: Callable[[Services], Resetter] | None = None,
    ) -> None:
        self.services = Services.create(
            db, index, agent, send, settings, metrics, clock, coordinator, events
        )
        self.commands: CommandRegistry = builtin_commands()
        session_commands.register(self.commands)
        self.resetter = resetter(self.services) if resetter is not None else None
        self._refused: set[tuple[str, str]] = set()
        self._paired = pairing.PairedUsers(db)  # the allowlist's pairing approvals
        self._accepting = True
        self._inflight: set[int] = set()  # inbox ids whose turn runs in this process
        coordinator = self.services.coordinator
        # several replicas: turns run under key leases, see _process_shared
        self._shared: SharedCoordinator | None = (
            coordinator if coordinator.shared else None  # type: ignore[assignment]
        )
        if self._shared is not None and self.resetter is not None:
            # a reset whose replica died before writing the route back is still announced
            self._shared.use_reset_notice(self.resetter.notice_for)
        self._done_here: set[int] = set()  # rows another local task's lease ran for it
        self._max_age_s: float | None = None  # recovery.max_age_seconds, once recover ran
        # key -> turns accepted but not yet queued on the key's lock (see _run)
        self._pending: dict[str, int] = {}
        # inbox id -> message taken while start-up recovery has not run yet (None: not held)
        self._held: dict[int, InboundMessage] | None = None
        self._crashed: list[dict[str, Any]] | None = None  # open rows read before intake

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

    def describe_reset(self, key: SessionKey) -> str:
        if self.resetter is None:
            return no_reset_policy(key)
        return self.resetter.describe(key.format())

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
        # (replicas never take the fast path: a key's turn starts with its lease)
        fast = self._idle_entry(msg, key) if self._shared is None else None
        if fast is not None:
            entry, release = fast
            try:
                inbox_id, state, new, begun = await s.db.accept_and_begin(
                    src.platform, src.chat_id, msg.platform_message_id, msg.as_payload(),
                    entry.session_id, user_message(msg, key),
                    last=s.settings.history_messages,
                )  # fmt: skip
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
                self._after_accept(msg, seen_key, inbox_id, state, new)
                return
        k = key.format()
        if self._shared is None:
            # While this message commits, no later message of the key may take the fast
            # path past it: the key's lock may come free meanwhile (its turn ends, recovery
            # stops holding), and a fast path would take it first. `_run` counts the turn
            # itself before this count goes.
            self._pending[k] = self._pending.get(k, 0) + 1
        try:
            if self._shared is None:
                inbox_id, state, new = await s.db.accept_inbound(
                    src.platform, src.chat_id, msg.platform_message_id, msg.as_payload()
                )
            else:  # the key's lease comes with the commit when the key is idle here (not
                # while start-up recovery holds turns: the lease would wait with them), and
                # a plain message's turn begins in it when the take allows (_begins_in)
                plan = None
                if self._held is None and parse_command(msg.text) is None:
                    plan = (user_message(msg, key), s.settings.history_messages,
                            self._begins_in)  # fmt: skip
                inbox_id, state, new, stored = await self._shared.accept(
                    k, src.platform, src.chat_id, msg.platform_message_id,
                    msg.as_payload(), lease=self._held is None, begin=plan,
                )  # fmt: skip
                if stored is not None:  # new, taken and begun: the turn goes on from there
                    if seen_key is not None:
                        s.coordinator.remember(seen_key)
                    faults.point("after_inbox_commit")
                    self._run(msg, inbox_id, stored=stored)
                    return
            self._after_accept(msg, seen_key, inbox_id, state, new)
        except StateError as exc:
            self._refuse(msg, exc)
        finally:
            if self._shared is None:
                self._unpend(k)

    def _unpend(self, k: str) -> None:
        left = self._pending[k] - 1
        if left:
            self._pending[k] = left
        else:
            del self._pending[k]

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
        if self._pending.get(k) or self._held is not None or parse_command(msg.text) is not None:
            return None
        entry = s.index.get(k)
        if entry is None or s.coordinator.has_notice(k):
            return None
        if self.resetter is not None and self.resetter.due_now(entry):
            return None
        release = s.coordinator.try_session_lock(k)
        if release is None:
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
        self, msg: InboundMessage, seen_key: tuple[str, str, str] | None, inbox_id: int,
        state: str, new: bool,
    ) -> None:  # fmt: skip
        s = self.services
        if seen_key is not None:
            s.coordinator.remember(seen_key)
        if not new and (state not in OPEN_STATES or inbox_id in self._inflight):
            s.metrics.dropped.inc(reason="duplicate")
            s.signals.ended(msg, "duplicate")
            return
        faults.point("after_inbox_commit")
        # new, or a redelivery of a turn a crash left unfinished (and not running): run it
        if self._held is not None:  # after what a crash left in the same chats: see recover
            self._held[inbox_id] = msg
            self._inflight.add(inbox_id)
            return
        self._run(msg, inbox_id)

    def _begins_in(self, route: Mapping[str, Any], inbox_id: int) -> str | None:
        """Replicas: may the turn of a message whose accept just took its key's lease begin
        in the same commit, and in which session? Its route's own live session, when the
        row is the key's only open one, no dead runner's reply waits, no notice is owed and
        no reset is due (what _process_locked would decide first, decided on the route the
        take read under the lease); else None, and the turn begins as usual. Called by the
        writer inside that transaction."""
        try:
            if [int(r["id"]) for r in route["open"]] != [inbox_id] or route.get("unsent"):
                return None
            if not (route.get("session_id") and route.get("route_found")
                    and route.get("route_ended") is None) or route.get("pending_notice"):  # fmt: skip
                return None
            entry = entry_from_route(route)
            if entry is None or (self.resetter is not None and self.resetter.due_now(entry)):
                return None
            return entry.session_id
        except Exception as exc:  # never fail the accept over it: the turn begins later
            log.warning("could not decide an early begin: %s", exc)
            return None

    def _run(
        self, msg: InboundMessage, inbox_id: int, begun: Begun | None = None, *,
        stored: Stored | None = None,
    ) -> None:  # fmt: skip
        """The message's turn as a task. `begun`: one daemon's fast path (locked, stored);
        `stored`: a replica's accept that took the lease also began the turn."""
        self._inflight.add(inbox_id)
        src = msg.source
        if begun is None and self._shared is None:
            # Until its task is queued on the key's lock, no later message of the key may
            # take the fast path past it.
            k = self.key_for(msg).format()
            self._pending[k] = self._pending.get(k, 0) + 1
        self.services.tasks.start(
            self._process(msg, inbox_id, begun, stored), f"turn:{src.platform}:{src.chat_id}"
        )

    async def hold_until_recovered(self) -> None:
        """Called before the adapters start: messages they hand over are committed (and so
        acknowledged) at once, but their turns wait until `recover` has sent the replies and
        queued the turns a crash left, so a chat's replies come in the order of its messages
        (a new message's reply never overtakes an older one's resend or re-run). The rows a
        crash left are read now, before intake: a row read later could be one this process
        just took, whose turn the hold runs (it would run twice)."""
        if self._held is None:
            self._held = {}
            if self._shared is None:  # replicas read theirs in the takeover scan
                self._crashed = await self.services.db.open_inbound()

    async def recover(self, max_age_s: float) -> tuple[int, int]:
        """Send the replies a crash left unconfirmed, then run again, in order, the turns it
        left unfinished (once each; one older than `max_age_s` gets a short apology naming
        it instead), then the turns of messages taken meanwhile (held). Returns (re-run,
        apologised)."""
        try:
            await self._resend_unconfirmed()
            return await self._rerun_open(max_age_s)
        finally:
            held, self._held = self._held or {}, None
            for inbox_id in sorted(held):  # taken after the open rows were read: newer
                self._run(held[inbox_id], inbox_id)

    async def _rerun_open(self, max_age_s: float) -> tuple[int, int]:
        s = self.services
        self._max_age_s = max_age_s
        rerun = apologised = 0
        shared = self._shared
        if shared is not None:  # replicas: the takeover scan's rows, each run under its lease
            rows = await shared.orphaned_inbound()
        else:
            # A key's begun turn (its message stored: at most one per key) held the key's
            # lock when the crash came, so it goes first: inbox ids follow the commits, and
            # a message to an idle key takes the lock before its commit, which may land
            # after a waiting one's. Then the others, oldest first; each key's lock keeps
            # that order.
            crashed, self._crashed = self._crashed, None
            if crashed is None:  # not held: nothing else takes messages meanwhile
                crashed = await s.db.open_inbound()
            rows = sorted(crashed, key=lambda r: (r["state"] != STARTED, r["id"]))
        for row in rows:
            inbox_id = int(row["id"])
            if self._held is not None and self._held.pop(inbox_id, None) is not None:
                self._inflight.discard(inbox_id)  # taken again while held: run it from here
            if inbox_id in self._inflight:
                continue
            try:
                msg = InboundMessage.from_payload(json.loads(row["payload"]))
            except (ValueError, TypeError) as exc:
                log.error("inbox row %d cannot be read (%s); dropped", inbox_id, exc)
                await s.db.finish_inbound(inbox_id, DROPPED, "unreadable")
                continue
            if shared is None and s.clock() - float(row["received_at"]) > max_age_s:
                # (replicas decide this under the key's lease, in _run_row)
                await s.replies.reply(msg, row["session_id"], too_old_apology(msg.text))
                await s.db.finish_inbound(inbox_id, DROPPED, "too_old")
                s.metrics.recovered.inc(outcome="apologised")
                apologised += 1
                continue
            if msg.platform_message_id is not None:
                s.coordinator.remember((msg.source.platform, msg.source.chat_id,
                                        msg.platform_message_id))  # fmt: skip
            s.metrics.recovered.inc(outcome="rerun")
            self._run(msg, inbox_id)
            rerun += 1
        if rerun or apologised:
            log.warning("recovered %d interrupted turn(s); %d too old, apologised for",
                        rerun, apologised)  # fmt: skip
        return rerun, apologised

    async def _resend_unconfirmed(self) -> None:
        """Replies a crash left unconfirmed: 'ready' ones are sent now (at least once);
        'sending' ones may have reached the chat, so they are counted, logged and left
        (at most once), unless inbox.resend_unconfirmed_replies asks for at least once or
        the platform's adapter shows a reply sent again under its key once (exactly once)."""
        s = self.services
        shared = self._shared
        if shared is None:
            for row in await s.db.unsent_replies():
                await self._resend_row(row)
            return
        # Replicas send a dead runner's replies under their key's lease, so no new turn of
        # the key (on any replica) sends its reply in between; the take returns them. A key
        # held meanwhile is left to its holder, whose take returned them the same way.
        keyless = []
        keys: dict[str, None] = {}
        for row in await shared.orphaned_replies():
            if row.get("session_key") is None:  # taken before replicas
                keyless.append(row)
            else:
                keys[str(row["session_key"])] = None
        for row in keyless:
            await self._resend_row(row)
        for key in keys:
            async with shared.lease_now(key) as lease:
                for row in lease.unsent if lease is not None else ():
                    await self._resend_row(row)

    async def _resend_row(self, row: dict[str, Any]) -> None:
        """One unconfirmed reply (a row of unsent_replies' shape), claimed first on replicas.
        No turn of this process is sending it: one daemon reads them before any turn runs,
        and a replica gets a dead runner's under the key's lease and local lock. (A task
        here may still wait for the row it took, which a dead replica ran: skipping the
        reply for that let the key's next reply overtake it.)"""
        s = self.services
        shared = self._shared
        inbox_id = int(row["id"])
        if shared is not None and not await shared.claim_reply(inbox_id):
            return  # another replica took this dead runner's reply: it sends it
        try:
            msg = InboundMessage.from_payload(json.loads(row["payload"]))
        except (ValueError, TypeError):
            await s.db.mark_reply(inbox_id, "failed")
            return
        safe = s.settings.resend_unconfirmed or idempotent_replies(msg.source.platform)
        if row["reply_state"] == "sending" and not safe:
            s.metrics.unsent.inc()
            log.warning("inbox row %d: its reply may not have reached the chat (the daemon "
                        "stopped while sending it); not sent again", inbox_id)  # fmt: skip
            await s.db.mark_reply(inbox_id, "unconfirmed")
            return
        text = content_text(row["content"]) or APOLOGY
        ref = await s.replies.reply(msg, row["session_id"], text,
                                    dedupe_key=reply_key(inbox_id), resend=True)  # fmt: skip
        s.metrics.recovered.inc(outcome="reply_resent")
        await mark_reply(s, inbox_id, ref)

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
            log.warning("pairing lookup for user %s on %s failed: %s", src.user_id,
                        src.platform, exc)  # fmt: skip
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
                code = await pairing.offer(s.db, rules, src.platform, src.user_id,
                                           src.user_name, src.chat_id, s.clock())  # fmt: skip
            except StateError as exc:
                log.warning("no pairing code for user %s on %s: %s", src.user_id, src.platform,
                            exc)  # fmt: skip
                code = None
            if code is not None:
                log.info("pairing code offered to user %s on %s", src.user_id, src.platform)
                text = pairing.code_message(code, rules.ttl_s)
                s.tasks.start(s.replies.reply(msg, None, text), "pairing code")
        return False

    # --- per-session work ----------------------------------------------------------------

    def key_for(self, msg: InboundMessage) -> SessionKey:
        return build_key(msg.source, self.services.settings.keys)

    async def _process(
        self, msg: InboundMessage, inbox_id: int, begun: Begun | None, stored: Stored | None
    ) -> None:
        if self._shared is not None:
            await self._process_shared(self._shared, msg, inbox_id, stored)
            return
        s = self.services
        started = s.clock()
        turn = TurnProgress(inbox_id=inbox_id)
        try:
            if begun is not None:  # the fast path: locked, stored, history read
                key, entry, history, release = begun
                turn.stored, turn.session_id = True, entry.session_id
                try:
                    try:
                        await agent_turn(s, msg, key, entry, started, turn, history)
                    except SessionNotFound as exc:  # deleted mid-turn: again, afresh
                        if not self._forget_deleted(key.format(), exc.ref):
                            raise
                        await self._process_locked(msg, key, started, turn)
                finally:
                    release()
            else:
                key = self.key_for(msg)
                k = key.format()
                self._unpend(k)  # no await from here into the lock's queue
                async with s.coordinator.session_lock(k):
                    try:
                        await self._process_locked(msg, key, started, turn)
                    except SessionNotFound as exc:
                        if not self._forget_deleted(k, exc.ref):
                            raise
                        await self._process_locked(msg, key, started, turn)  # a fresh session
        except Exception as exc:  # nothing may escape into the event loop
            await self._failed(msg, turn, exc)
        finally:
            self._inflight.discard(inbox_id)
            s.signals.ended(msg, turn.dropped)

    async def _failed(self, msg: InboundMessage, turn: TurnProgress, exc: Exception) -> None:
        """A message's work failed: logged, answered with an apology, its row closed."""
        s = self.services
        s.metrics.last_error = f"{type(exc).__name__}: {exc}"
        s.metrics.errors.inc(kind="turn")
        if turn.stored and turn.fence is not None and isinstance(exc, StoreUnavailable):
            # replicas: the database went away mid-turn. The row stays open under a lease
            # that the rejoin voids, and is run again once the database is back (the
            # takeover scan); an apology now could precede the real reply, stored or not
            log.warning("turn for session_key=%s platform=%s is run again once the database "
                        "is back: %s", self.key_for(msg).format(), msg.source.platform, exc)  # fmt: skip
            turn.dropped = "in_flight"
            return
        log.error("turn failed for session_key=%s platform=%s", self.key_for(msg).format(),
                  msg.source.platform, exc_info=exc)  # fmt: skip
        # "Your message was saved" only when it was: anything failing before the store
        # (a message the database refuses, a command) is reported as not stored
        if turn.stored:
            await s.replies.reply(msg, turn.session_id, APOLOGY, self.key_for(msg),
                                  error="agent")  # fmt: skip
            await self._close(turn, ANSWERED, "agent_error")
        elif isinstance(exc, UnstorableData):  # sending it again cannot help
            await s.replies.reply(msg, None, UNSTORABLE_APOLOGY, error="unstorable")
            await self._close(turn, DROPPED, "not_stored")
        else:
            await s.replies.reply(msg, None, STORAGE_APOLOGY, error="storage")
            # the chat was told to send it again: no second apology after a restart
            await self._close(turn, DROPPED, "not_stored")

    async def _guarded(
        self, msg: InboundMessage, key: SessionKey, started: float, turn: TurnProgress
    ) -> None:
        """Replicas: one message under its key's lease; a failure is answered with an
        apology and closes the row (fenced). LeaseLost passes through: this replica may no
        longer answer."""
        k = key.format()
        try:
            try:
                await self._process_locked(msg, key, started, turn)
            except SessionNotFound as exc:
                if not self._forget_deleted(k, exc.ref):
                    raise
                turn.begun = None
                await self._process_locked(msg, key, started, turn)  # in a fresh session
        except LeaseLost:
            raise
        except Exception as exc:  # nothing may escape into the event loop
            await self._failed(msg, turn, exc)

    async def _process_shared(
        self, coordinator: SharedCoordinator, msg: InboundMessage, inbox_id: int,
        stored: Stored | None = None,
    ) -> None:  # fmt: skip
        """Replicas: take the key's lease, then run the key's open inbox rows in id order
        (this message's, and any another replica took meanwhile, so neither overtakes the
        other). A row answered elsewhere while waiting only tells the platform side."""
        s = self.services
        key = self.key_for(msg)
        k = key.format()
        try:
            async with coordinator.lease(k, inbox_id) as lease:
                if lease is not None and not any(int(r["id"]) == inbox_id for r in lease.open):
                    if inbox_id not in self._done_here and await coordinator.row_open(inbox_id):
                        # a row without its key (taken before replicas): run it here too
                        lease.open.append({"id": inbox_id, "replica": None})
                if lease is None or not any(int(r["id"]) == inbox_id for r in lease.open):
                    if inbox_id in self._done_here:
                        self._done_here.discard(inbox_id)  # run and signalled by the drain
                    else:
                        s.signals.ended(msg, "answered_elsewhere")
                if lease is not None:
                    await self._drain(lease, key, msg, inbox_id, stored)
        except Exception as exc:  # nothing may escape into the event loop
            s.metrics.last_error = f"{type(exc).__name__}: {exc}"
            s.metrics.errors.inc(kind="turn")
            log.exception("lease work failed for session_key=%s", k)
        finally:
            self._inflight.discard(inbox_id)

    async def _drain(
        self, lease: Lease, key: SessionKey, mine: InboundMessage, inbox_id: int,
        stored: Stored | None = None,
    ) -> None:  # fmt: skip
        s = self.services
        assert self._shared is not None
        me = self._shared.me
        holds = functools.partial(self._shared.holds, lease.fence)
        for unsent in lease.unsent:  # a dead runner's replies go out before the next ones
            await self._resend_row(unsent)
        for row in lease.open:
            rid = int(row["id"])
            if rid == inbox_id:
                msg = mine
            else:
                try:
                    msg = InboundMessage.from_payload(json.loads(row["payload"]))
                except (ValueError, TypeError) as exc:
                    log.error("inbox row %d cannot be read (%s); dropped", rid, exc)
                    await s.db.finish_inbound(rid, DROPPED, "unreadable", fence=lease.fence)
                    continue
            other_task = rid != inbox_id and rid in self._inflight
            self._inflight.add(rid)
            origin = row.get("replica")
            elsewhere = origin is not None and int(origin) != me
            turn = TurnProgress(inbox_id=rid, fence=lease.fence, holds=holds,
                                begun=stored if rid == inbox_id else None)  # fmt: skip
            if row is lease.open[-1]:  # the last row: its reply's commit may free the lease
                turn.hand_back = self._shared.hand_back(lease, [(int(origin), rid)] if elsewhere
                                                        else [])  # fmt: skip
            try:
                await self._run_row(msg, key, row, turn)
            except LeaseLost:
                log.warning("session_key=%s: the lease was taken over during inbox row %d; "
                            "its reply is withheld (the new holder answers it)", key, rid)  # fmt: skip
                turn.dropped = "answered_elsewhere"  # the new holder answers it
                return
            finally:
                if other_task:
                    self._done_here.add(rid)
                elif rid != inbox_id:
                    self._inflight.discard(rid)
                s.signals.ended(msg, turn.dropped)
            if elsewhere:
                lease.answered.append((int(origin), rid))

    async def _run_row(
        self, msg: InboundMessage, key: SessionKey, row: dict[str, Any], turn: TurnProgress
    ) -> None:
        s = self.services
        if (self._max_age_s is not None and row.get("received_at") is not None
                and s.clock() - float(row["received_at"]) > self._max_age_s):  # fmt: skip
            await s.replies.reply(msg, row.get("session_id"), too_old_apology(msg.text))
            await s.db.finish_inbound(turn.inbox_id, DROPPED, "too_old", fence=turn.fence)
            s.metrics.recovered.inc(outcome="apologised")
            return
        await self._guarded(msg, key, s.clock(), turn)

    async def _process_locked(
        self, msg: InboundMessage, key: SessionKey, started: float, turn: TurnProgress
    ) -> None:
        s = self.services
        if turn.begun is not None:  # begun in the accept's commit, which decided the rest
            # in the session of the route that commit's take read (the index has it since,
            # and nothing else touched the key: its lease and local lock were held)
            entry = s.index.get(key.format())
            if entry is not None:
                await agent_turn(s, msg, key, entry, started, turn, turn.begun)
                return
            turn.begun = None
        entry = await self.entry_for(key, msg)
        if self.resetter is not None:
            entry = await self.resetter.check(key.format(), entry)
            notice = self.resetter.take_notice(key.format())
            if notice:
                await s.replies.reply(msg, entry.session_id, notice, key, notice=True)
        parsed = parse_command(msg.text)
        if parsed is not None:
            name, args = parsed
            command = self.commands.get(name)
            if command is None:
                text = f"Unknown command /{name}. Send /help for the list."
            else:
                ctx = CommandContext(s, msg, key, entry.session_id, args, self.describe_reset)
                text = await command.handler(ctx)
            # /new, /branch, /resume ... change the key's session: answer with the live one
            live = s.index.get(key.format())
            # Closed before the reply goes: a crash in between loses the reply (at most
            # once, as a Telegram reply), never runs /new or /branch a second time.
            closing = time.monotonic()
            try:
                await s.db.finish_inbound(turn.inbox_id, ANSWERED, "command", fence=turn.fence)
            except LeaseLost:
                raise  # another replica holds the key now: this one may not answer
            except Exception as exc:  # the store is failing: recovery will see the row
                log.warning("inbox row %d could not be closed (%s)", turn.inbox_id, exc)
            await may_send(turn, closing)
            sid = live.session_id if live else entry.session_id
            await send_checked(turn, lambda _since, _again: s.replies.reply(msg, sid, text, key))
            return
        await agent_turn(s, msg, key, entry, started, turn)

    async def _close(self, turn: TurnProgress, state: str, reason: str) -> None:
        try:
            await self.services.db.finish_inbound(turn.inbox_id, state, reason, fence=turn.fence)
        except Exception as exc:  # the store is failing: recovery will see the row
            log.warning("inbox row %d could not be closed (%s)", turn.inbox_id, exc)

    def _forget_deleted(self, k: str, session_id: str) -> bool:
        """The key's session was deleted under the daemon (`sessions delete` from another
        process): drop the entry so the retried message starts a fresh session (never the
        deleted id again). False when the missing session is not this key's."""
        index = self.services.index
        entry = index.get(k)
        if entry is None or entry.session_id != session_id:
            return False
        log.warning("session %s of session_key=%s was deleted; starting a fresh one", session_id, k)
        index.remove(k)
        return True

    async def entry_for(self, key: SessionKey, msg: InboundMessage) -> IndexEntry:
        """The index entry for this key, creating the session on first contact."""
        sessions = self.services.sessions
        entry = self.services.index.get(key.format()) or await sessions.adopt(key)
        if entry is not None:
            return entry
        try:
            return await sessions.create(key, msg.source)
        except LiveSessionExists:
            # another process made the key's session since the look above: a replica that
            # took the key over while this one stalled (this turn's next fenced write finds
            # the lease lost and answers nothing), or a `sessions import` beside one daemon
            entry = await sessions.adopt(key)
            if entry is None:
                raise
            return entry

    # --- shutdown ------------------------------------------------------------------------

    def stop_intake(self) -> None:
        self._accepting = False

    async def drain(self, budget_s: float) -> int:
        """Let in-flight turns finish within the budget, then cancel the rest.
        Returns how many were cancelled."""
        return await self.services.tasks.drain(budget_s)
