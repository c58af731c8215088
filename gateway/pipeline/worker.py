"""The per-key worker: a key's open inbox rows, in id order, under the key's lease from the
topology (one daemon: its in-process lock and this one row; replicas: the lease on
PostgreSQL and every open row of the key): a command or an agent turn for each, and the
apology when it fails.

Intake and recovery hand it messages (`run`); running the agent is gateway.turns'.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence

from gateway.commands import CommandContext, CommandRegistry, no_reset_policy, parse_command
from gateway.index import IndexEntry
from gateway.messages import InboundMessage
from gateway.pipeline.inflight import InFlight
from gateway.pipeline.outbox import Outbox, too_old_apology
from gateway.reset import Resetter
from gateway.services import Services
from gateway.session_keys import SessionKey, build_key
from gateway.topology.base import KeyLease, Topology
from gateway.topology.leases import InboxRow, Stored
from gateway.turns import APOLOGY, TurnProgress, agent_turn, may_send, send_checked
from state import (
    ANSWERED,
    DROPPED,
    LeaseLost,
    LiveSessionExists,
    SessionNotFound,
    StoreUnavailable,
    UnstorableData,
)

log = logging.getLogger("gateway.router")

# A fast-path turn handed to its task: the key, its entry, begin_turn's result (the user's
# message id and the history) and the release of the key's lock, which the task now owns.
Begun = tuple[SessionKey, IndexEntry, Stored, Callable[[], None]]

STORAGE_APOLOGY = (
    "Sorry, I could not store your message just now; please send it again in a moment."
)
UNSTORABLE_APOLOGY = "Sorry, I cannot store that message: it holds text I cannot keep."


def _has_row(rows: Sequence[InboxRow], inbox_id: int) -> bool:
    for row in rows:
        if int(row["id"]) == inbox_id:
            return True
    return False


class Worker:
    """Runs each accepted message as a tracked task, serialised per session key."""

    def __init__(
        self,
        services: Services,
        commands: CommandRegistry,
        resetter: Resetter | None,
        flight: InFlight,
        outbox: Outbox,
        topology: Topology,
    ) -> None:
        self.services = services
        self.commands = commands
        self.resetter = resetter
        self._flight = flight
        self._inflight = flight.running
        self._done_here = flight.done_here
        self._outbox = outbox
        self._topology = topology

    def key_for(self, msg: InboundMessage) -> SessionKey:
        return build_key(msg.source, self.services.settings.keys)

    def describe_reset(self, key: SessionKey) -> str:
        if self.resetter is None:
            return no_reset_policy(key)
        return self.resetter.describe(key.format())

    def run(
        self,
        msg: InboundMessage,
        inbox_id: int,
        begun: Begun | None = None,
        *,
        stored: Stored | None = None,
        key: SessionKey | None = None,
    ) -> None:
        """The message's turn as a task. `begun`: one daemon's fast path (locked, stored);
        `stored`: an accept that took the key's lease also began the turn; `key`: the
        message's key when the caller has it."""
        self._inflight.add(inbox_id)
        src = msg.source
        if begun is None:
            key = key or self.key_for(msg)
            # Until its task is queued on the key's lock, no later message of the key may
            # take the fast path past it.
            self._flight.pend(key.format())
        self.services.tasks.start(
            self._process(msg, inbox_id, stored, key)
            if begun is None
            else self._process_begun(msg, inbox_id, begun),
            f"turn:{src.platform}:{src.chat_id}",
        )

    async def _process(
        self, msg: InboundMessage, inbox_id: int, stored: Stored | None, key: SessionKey | None
    ) -> None:
        """Take the key's lease (one daemon: its lock), then run the key's open inbox rows
        in id order: this message's, and on replicas any another replica took meanwhile,
        so neither overtakes the other. A row answered elsewhere while waiting only tells
        the platform side."""
        s = self.services
        started = s.clock()
        key = key or self.key_for(msg)
        k = key.format()
        topology = self._topology
        self._flight.unpend(k)  # no await from here into the lock's queue
        try:
            async with topology.lease(k, inbox_id) as lease:
                if lease is not None and not _has_row(lease.open, inbox_id):
                    if inbox_id not in self._done_here and await topology.row_open(inbox_id):
                        # a row without its key (taken before replicas): run it here too
                        lease.open.append({"id": inbox_id, "replica": None})
                if lease is None or not _has_row(lease.open, inbox_id):
                    if inbox_id in self._done_here:
                        self._done_here.discard(inbox_id)  # run and signalled by the drain
                    else:
                        s.signals.ended(msg, "answered_elsewhere")
                if lease is not None:
                    await self._drain(lease, key, msg, inbox_id, started, stored)
        except Exception as exc:  # nothing may escape into the event loop
            s.metrics.last_error = f"{type(exc).__name__}: {exc}"
            s.metrics.errors.inc(kind="turn")
            log.exception("lease work failed for session_key=%s", k)
        finally:
            self._inflight.discard(inbox_id)

    async def _drain(
        self,
        lease: KeyLease,
        key: SessionKey,
        mine: InboundMessage,
        inbox_id: int,
        started: float,
        stored: Stored | None,
    ) -> None:
        """The key's rows under its lease: a dead runner's replies first, then each open
        row in id order, its command or turn (one older than recovery.max_age_seconds gets
        the too-old apology: a recovered row's age is judged here on replicas), a failure
        answered with an apology and the row closed (fenced). LeaseLost ends it: the new
        holder answers the rest."""
        s = self.services
        topology = self._topology
        for unsent in lease.unsent:
            await self._outbox.resend_row(unsent)
        max_age_s = self._flight.max_age_s
        k = key.format()
        rows = lease.open
        for row in rows:
            rid = int(row["id"])
            if rid == inbox_id:
                msg, row_started = mine, started
            else:
                try:
                    msg = InboundMessage.from_payload(json.loads(row["payload"]))
                except (ValueError, TypeError) as exc:
                    log.error("inbox row %d cannot be read (%s); dropped", rid, exc)
                    await s.db.finish_inbound(rid, DROPPED, "unreadable", fence=lease.fence)
                    continue
                row_started = s.clock()
            other_task = rid != inbox_id and rid in self._inflight
            self._inflight.add(rid)
            turn = TurnProgress(
                inbox_id=rid,
                lease=topology.turn_lease(
                    lease, row, row is rows[-1], stored if rid == inbox_id else None
                ),
            )
            try:
                if (
                    max_age_s is not None
                    and row.get("received_at") is not None
                    and s.clock() - float(row["received_at"]) > max_age_s
                ):
                    await self._too_old(msg, row, turn)
                else:
                    await self._guarded(msg, key, k, row_started, turn)
            except LeaseLost:
                log.warning(
                    "session_key=%s: the lease was taken over during inbox row %d; "
                    "its reply is withheld (the new holder answers it)",
                    key,
                    rid,
                )
                turn.dropped = "answered_elsewhere"  # the new holder answers it
                return
            finally:
                if other_task:
                    self._done_here.add(rid)
                elif rid != inbox_id:
                    self._inflight.discard(rid)
                s.signals.ended(msg, turn.dropped)
            topology.ran(lease, row)

    async def _process_begun(self, msg: InboundMessage, inbox_id: int, begun: Begun) -> None:
        """One daemon's fast path: the key's lock was taken at intake and the message
        stored in its session in the accept's commit, the history read."""
        s = self.services
        started = s.clock()
        turn = TurnProgress(inbox_id=inbox_id)
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
        if turn.stored and turn.lease.fence is not None and isinstance(exc, StoreUnavailable):
            # replicas: the database went away mid-turn. The row stays open under a lease
            # that the rejoin voids, and is run again once the database is back (the
            # takeover scan); an apology now could precede the real reply, stored or not
            log.warning(
                "turn for session_key=%s platform=%s is run again once the database is back: %s",
                self.key_for(msg).format(),
                msg.source.platform,
                exc,
            )
            turn.dropped = "in_flight"
            return
        log.error(
            "turn failed for session_key=%s platform=%s",
            self.key_for(msg).format(),
            msg.source.platform,
            exc_info=exc,
        )
        # "Your message was saved" only when it was: anything failing before the store
        # (a message the database refuses, a command) is reported as not stored
        if turn.stored:
            await s.replies.reply(msg, turn.session_id, APOLOGY, self.key_for(msg), error="agent")
            await self._close(turn, ANSWERED, "agent_error")
        elif isinstance(exc, UnstorableData):  # sending it again cannot help
            await s.replies.reply(msg, None, UNSTORABLE_APOLOGY, error="unstorable")
            await self._close(turn, DROPPED, "not_stored")
        else:
            await s.replies.reply(msg, None, STORAGE_APOLOGY, error="storage")
            # the chat was told to send it again: no second apology after a restart
            await self._close(turn, DROPPED, "not_stored")

    async def _guarded(
        self, msg: InboundMessage, key: SessionKey, k: str, started: float, turn: TurnProgress
    ) -> None:
        try:
            try:
                await self._process_locked(msg, key, started, turn)
            except SessionNotFound as exc:
                if not self._forget_deleted(k, exc.ref):
                    raise
                if turn.lease.begun is not None:
                    turn.lease.begun = None
                await self._process_locked(msg, key, started, turn)  # in a fresh session
        except LeaseLost:
            raise  # this process may no longer answer
        except Exception as exc:  # nothing may escape into the event loop
            await self._failed(msg, turn, exc)

    async def _too_old(self, msg: InboundMessage, row: InboxRow, turn: TurnProgress) -> None:
        s = self.services
        await s.replies.reply(msg, row.get("session_id"), too_old_apology(msg.text))
        await s.db.finish_inbound(turn.inbox_id, DROPPED, "too_old", fence=turn.lease.fence)
        s.metrics.recovered.inc(outcome="apologised")

    async def _process_locked(
        self, msg: InboundMessage, key: SessionKey, started: float, turn: TurnProgress
    ) -> None:
        s = self.services
        lease = turn.lease
        if lease.begun is not None:  # begun in the accept's commit, which decided the rest
            # in the session of the route that commit's take read (the index has it since,
            # and nothing else touched the key: its lease and local lock were held)
            entry = s.index.get(key.format())
            if entry is not None:
                await agent_turn(s, msg, key, entry, started, turn, lease.begun)
                return
            lease.begun = None
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
                await s.db.finish_inbound(
                    turn.inbox_id, ANSWERED, "command", fence=turn.lease.fence
                )
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
            await self.services.db.finish_inbound(
                turn.inbox_id, state, reason, fence=turn.lease.fence
            )
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
