"""Applying reset policies: one idempotent `apply(now)` used by the scheduler's sweep, and a
lazy `check` the router runs on each message, so a reset is exact even if a sweep is late.

A reset runs the pre-reset hook first (bounded in time; a failure is logged, never
blocking), then ends the old session with `idle`/`daily` and starts a `reset` child. With
`notify`, the chat's next message gets one line saying why and how to go back (only if the
old session had any messages). A session with no messages is never reset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gateway.index import IndexEntry
from gateway.reset.policy import PolicySet, ResetDecision, ResetPolicy, decide
from gateway.services import Services
from gateway.session_keys import SessionSource, parse_key
from state import EndReason, SessionRow

log = logging.getLogger("gateway.reset")
PreResetHook = Callable[[str, str], Awaitable[None]]


async def no_hook(session_id: str, reason: str) -> None:
    return None


class Resetter:
    def __init__(
        self,
        services: Services,
        policies: PolicySet,
        *,
        hook: PreResetHook = no_hook,
        hook_timeout_s: float = 10.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.services = services
        self.policies = policies
        self.hook = hook
        self.hook_timeout_s = hook_timeout_s
        self.clock = clock or services.clock
        self._empty: dict[str, IndexEntry] = {}  # session id -> its entry when seen empty
        self.resets = 0

    def policy_for(self, entry: IndexEntry) -> ResetPolicy:
        return self.policies.for_chat(entry.platform, entry.chat_type)

    def decide(self, entry: IndexEntry, now: float, *, known_empty: bool = True) -> ResetDecision:
        live = bool(self.services.coordinator.live_jobs(entry.session_id))
        # known-empty until a turn touches the entry, which replaces the entry object
        empty = known_empty and self._empty.get(entry.session_id) is entry
        return decide(entry.updated_at, now, live, self.policy_for(entry), empty=empty)

    def due_now(self, entry: IndexEntry) -> bool:
        """Might `check` reset this entry now? (The router's fast path asks first; False
        means `check` would keep it, so the turn may skip it.)"""
        return self.decide(entry, self.clock(), known_empty=False).reason is not None

    async def _due(
        self, entry: IndexEntry, now: float, *, known_empty: bool = True
    ) -> tuple[EndReason, SessionRow] | None:
        """The reason to reset `entry` now and its session row, or None. state.db is asked
        only once the policy says a reset is due: an empty session (or one that no longer
        exists) is never reset, else every idle chat would grow a chain of empty sessions.
        `known_empty=False` asks again about a session remembered as empty (a background
        job stores messages without touching the entry)."""
        if self.decide(entry, now, known_empty=known_empty).reason is None:
            return None
        row = await self.services.db.get_session(entry.session_id)
        if row is None:  # deleted under the daemon: the chat's next message starts afresh
            return None
        if not row.get("message_count"):
            self._empty[entry.session_id] = entry
            return None
        self._empty.pop(entry.session_id, None)
        reason = self.decide(entry, now).reason
        return None if reason is None else (reason, row)

    async def apply(self, now: float | None = None) -> int:
        """Reset every index entry whose policy says so. Idempotent: a reset session has
        fresh activity and no messages, so running twice (or a late, doubled fire) resets
        nothing more."""
        at = self.clock() if now is None else now
        await self.services.index.sync_all()  # replicas: routes other replicas changed
        await self.services.coordinator.sync_jobs()  # replicas: other replicas' jobs
        items = self.services.index.items()
        current_ids = {entry.session_id for _, entry in items}
        self._empty = {sid: e for sid, e in self._empty.items() if sid in current_ids}
        done = 0
        index, coordinator = self.services.index, self.services.coordinator
        for key, entry in items:
            if self.decide(entry, at).reason is None:
                continue
            async with coordinator.session_lock(key):
                current = index.get(key)  # a message may have moved it meanwhile
                if current is None:
                    continue
                due = await self._due(current, at)
                if due is not None:
                    await self._reset(key, current, *due)
                    done += 1
        return done

    async def check(self, key: str, entry: IndexEntry) -> IndexEntry:
        """The lazy path, for the router (which holds the session lock already)."""
        due = await self._due(entry, self.clock(), known_empty=False)
        if due is None:
            return entry
        return await self._reset(key, entry, *due)

    async def _reset(
        self, key: str, entry: IndexEntry, reason: EndReason, old: SessionRow
    ) -> IndexEntry:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.hook_timeout_s):
                await self.hook(entry.session_id, reason)
        except Exception as exc:  # the reset goes ahead; the hook had its chance
            log.warning("pre-reset hook failed for session_key=%s: %s", key, exc)
        old = await self.services.db.get_session(entry.session_id) or old  # the hook may title it
        new, _ = await self.services.sessions.reset(
            parse_key(key), SessionSource.from_dict(entry.origin), reason
        )
        self._empty[new.session_id] = new  # a reset child starts with no messages
        self.resets += 1
        self.services.metrics.resets.inc(reason=reason)
        log.info("session_key=%s reset (%s) in %.3fs", key, reason, time.monotonic() - started)
        notice = self.notice_for(entry, reason, old)
        if notice is not None:
            self.services.coordinator.set_notice(key, notice)
        return new

    def notice_for(self, entry: IndexEntry, reason: str, old: Mapping[str, Any]) -> str | None:
        """The line a reset of `entry`'s chat owes it: why, and how to go back to the `old`
        session row (its title, else its id). None when the chat's policy does not notify
        or the old session had no messages. Replicas also word it for a reset whose replica
        died before writing the route back (gateway/topology/routes.py), so both say the same."""
        if not self.policy_for(entry).notify or not (old.get("message_count") or 0):
            return None
        handle = old.get("title") or old["id"]
        why = "after a period of inactivity" if reason == EndReason.IDLE else "for the daily reset"
        return f"A new session was started {why}. Send /resume {handle} to go back."

    def take_notice(self, key: str) -> str | None:
        return self.services.coordinator.take_notice(key)

    async def restore_notices(self) -> int:
        """At start-up of a single daemon: the notices of resets the chat may not have been
        told about before the restart (they live in memory). A reset whose new session is
        still empty and still the key's indexed session is owed its line; if the chat's
        next message before the restart was a command (which stores nothing), the line is
        told again: at least once, never lost. Replicas derive the same from the route
        (gateway/topology/routes.py). Returns how many notices were restored."""
        restored = 0
        for row in await self.services.db.untold_resets():
            key = row["session_key"]
            entry = self.services.index.get(key)
            if entry is None or entry.session_id != row["session_id"]:
                continue
            old = {
                "id": row["old_id"],
                "title": row["old_title"],
                "message_count": row["old_messages"],
            }
            notice = self.notice_for(entry, row["end_reason"], old)
            if notice is not None and not self.services.coordinator.has_notice(key):
                self.services.coordinator.set_notice(key, notice)
                restored += 1
        if restored:
            log.info("%d reset notice(s) restored from state.db", restored)
        return restored

    def describe(self, key: str) -> str:
        entry = self.services.index.get(key)
        if entry is None:
            return self.policies.default.describe()
        policy = self.policy_for(entry)
        text = policy.describe()
        decision = self.decide(entry, self.clock())
        if decision.due_at is not None:
            when = datetime.fromtimestamp(decision.due_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
            text += (
                f"; next reset {'held by a live job' if decision.blocked_by_jobs else 'at ' + when}"
            )
        return text
