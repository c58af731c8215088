"""`PgRouteIndex`: the route index of several replicas, a local cache of the shared
`session_routes` table (state/pg/cluster.py).

Every change to a route happens under its key's lease, and taking the lease refreshes the
key's entry from the table (gateway/topology/cluster.py), so while this replica holds a key its
entry here is exact and `get()` stays a dict lookup. Changes (a new session, activity, the
pending notice, the `/resume N` listing) are written back in the statement that frees the
lease. Keys this replica does not hold may be stale here; the reset sweep re-reads all of
them first (`sync_all`). A route whose session ended or vanished under it is healed at the
take, from the key's live session, as sessions.json is healed at start-up.

A reset's notice is owed even when the replica that reset the key died before freeing the
lease, so before writing `pending_notice`: the take derives it from what the reset itself
committed. The reset is one transaction (state/pg/lineage.py's fork): the old session ends
`idle`/`daily` and its `reset` child becomes the key's live session. A route that still names
that ended session while the key's live session is its reset child, still empty, is exactly
such a reset (the chat is told under a later lease, whose release writes the route, and a
turn stores the chat's message in the child): the healed route gets the notice
(`reset_notice`: the Resetter's wording and policy) and writes it at its release like any
other. Before the reset commits there is nothing to tell; after, the facts are durable and
every take derives the notice again until a release has written it. Deriving is simpler than
writing the notice in the reset's transaction: that fork is the store's generic operation,
shared with SQLite (which has no routes table), and the wording and the `notify` policy are
the gateway's. A replica that told the chat but died before freeing the lease, with nothing
stored in the child yet (a command, a turn cut short), may have it told again: at least
once, never lost.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.index import IndexEntry
from gateway.topology.leases import ResetNotice
from state import ChildKind, EndReason

log = logging.getLogger("gateway.routes")

_POLICY_RESETS = (EndReason.IDLE, EndReason.DAILY)


@dataclass
class _Route:
    entry: IndexEntry | None
    notice: str | None = None
    listing: list[str] | None = None
    dirty: bool = False


def _origin(text: Any) -> dict[str, Any]:
    if not text:
        return {}
    try:
        found = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _name(origin: Mapping[str, Any]) -> str | None:
    return origin.get("chat_name") or origin.get("user_name")


def entry_from_route(row: Mapping[str, Any]) -> IndexEntry | None:
    """The entry a freshly taken route row stands for: its own session while that is live,
    else the key's live session (a crash between a session change and the release left
    the route behind), else none (the next message starts a session)."""
    if row.get("session_id") and row.get("route_found") and row.get("route_ended") is None:
        origin = _origin(row.get("origin"))
        created = row.get("created_at") or 0.0
        updated = max(float(row.get("updated_at") or created), float(row.get("route_active") or 0))
        return IndexEntry(
            session_id=str(row["session_id"]),
            created_at=float(created),
            updated_at=updated,
            origin=origin,
            display_name=row.get("display_name") or _name(origin),
            platform=str(row.get("platform") or ""),
            chat_type=str(row.get("chat_type") or "dm"),
        )
    if row.get("live_id"):
        origin = _origin(row.get("live_origin"))
        started = float(row.get("live_started") or 0.0)
        if row.get("session_id"):
            log.warning(
                "route %s pointed at %s, no longer live; healed to %s",
                row["session_key"],
                row["session_id"],
                row["live_id"],
            )
        return IndexEntry(
            session_id=str(row["live_id"]),
            created_at=started,
            updated_at=float(row.get("live_active") or started),
            origin=origin,
            display_name=_name(origin),
            platform=str(row.get("live_source") or ""),
            chat_type=str(row.get("live_chat_type") or "dm"),
        )
    return None


def unannounced_reset(row: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """A freshly taken route row's reset that committed but was never written back (see the
    module docstring): (its end reason, the old session's `id`, `title`, `message_count`),
    else None. The live session must be the route's session's `reset` child, still empty."""
    if (
        row.get("session_id")
        and row.get("route_ended") is not None
        and row.get("route_end_reason") in _POLICY_RESETS
        and row.get("live_id")
        and row.get("live_parent") == row["session_id"]
        and row.get("live_kind") == ChildKind.RESET
        and not row.get("live_messages")
    ):
        old = {
            "id": str(row["session_id"]),
            "title": row.get("route_title"),
            "message_count": int(row.get("route_messages") or 0),
        }
        return str(row["route_end_reason"]), old
    return None


@dataclass
class PgRouteIndex:
    """RouteIndex over `session_routes`. `load_all` reads every route (given by the
    coordinator, which owns the store calls); `reset_notice` words the notice of a reset
    found unannounced at a take (the Resetter's, given through the coordinator's
    `use_reset_notice`; without one, none is derived)."""

    load_all: Callable[[], Awaitable[list[dict[str, Any]]]]
    reset_notice: ResetNotice | None = None
    _routes: dict[str, _Route] = field(default_factory=dict)

    # --- what the coordinator feeds in and takes out --------------------------------------

    def refresh(self, key: str, row: Mapping[str, Any]) -> None:
        """The key's lease was just taken: its route as the table has it (healed, with the
        notice of a reset its replica died before writing back)."""
        entry = entry_from_route(row)
        listing = json.loads(row["listing"]) if row.get("listing") else None
        healed = entry is not None and entry.session_id != row.get("session_id")
        notice = row.get("pending_notice")
        missed = unannounced_reset(row)
        if entry is not None and missed is not None and self.reset_notice is not None:
            owed = self.reset_notice(entry, *missed)
            if owed is not None:
                log.info(
                    "session_key=%s: its %s reset was not written back; the notice is "
                    "kept for its next message",
                    key,
                    missed[0],
                )
                notice = owed
        self._routes[key] = _Route(
            entry, notice, listing, dirty=healed or (entry is None and bool(row.get("session_id")))
        )

    def changes(self, key: str, *, peek: bool = False) -> dict[str, Any] | None:
        """The route's columns to write when the lease is freed, or None if unchanged;
        `peek`: the route stays changed (its write has not committed yet)."""
        route = self._routes.get(key)
        if route is None or not route.dirty:
            return None
        route.dirty = peek
        e = route.entry
        return {
            "session_id": e.session_id if e else None,
            "origin": json.dumps(e.origin, ensure_ascii=False) if e else None,
            "display_name": e.display_name if e else None,
            "platform": e.platform if e else None,
            "chat_type": e.chat_type if e else None,
            "created_at": e.created_at if e else None,
            "updated_at": e.updated_at if e else None,
            "pending_notice": route.notice,
            "listing": None if route.listing is None else json.dumps(route.listing),
        }

    def notice(self, key: str, text: str | None, *, take: bool = False) -> str | None:
        """Set the key's pending notice (`text`), or read it (`take` also clears it)."""
        route = self._routes.setdefault(key, _Route(None))
        if text is not None:
            route.notice, route.dirty = text, True
            return text
        found = route.notice
        if take and found is not None:
            route.notice, route.dirty = None, True
        return found

    def listing(self, key: str) -> list[str] | None:
        route = self._routes.get(key)
        return None if route is None else route.listing

    def set_listing(self, key: str, session_ids: list[str] | None) -> None:
        route = self._routes.setdefault(key, _Route(None))
        route.listing, route.dirty = session_ids, True

    # --- RouteIndex ----------------------------------------------------------------------

    async def load(self) -> str:
        await self.sync_all()
        return "loaded (session_routes)"

    async def sync_all(self) -> None:
        """Every route as the table has it; keys held here keep their (exact) entries."""
        fresh: dict[str, _Route] = {}
        for row in await self.load_all():
            key = str(row["session_key"])
            held = self._routes.get(key)
            if held is not None and held.dirty:
                fresh[key] = held
                continue
            origin = _origin(row.get("origin"))
            created = float(row.get("created_at") or 0.0)
            entry = IndexEntry(
                session_id=str(row["session_id"]),
                created_at=created,
                updated_at=float(row.get("updated_at") or created),
                origin=origin,
                display_name=row.get("display_name") or _name(origin),
                platform=str(row.get("platform") or ""),
                chat_type=str(row.get("chat_type") or "dm"),
            )
            listing = json.loads(row["listing"]) if row.get("listing") else None
            fresh[key] = _Route(entry, row.get("pending_notice"), listing)
        for key, route in self._routes.items():  # held changes not yet written
            if route.dirty and key not in fresh:
                fresh[key] = route
        self._routes = fresh

    def get(self, key: str) -> IndexEntry | None:
        route = self._routes.get(key)
        return None if route is None else route.entry

    def items(self) -> list[tuple[str, IndexEntry]]:
        return [(k, r.entry) for k, r in self._routes.items() if r.entry is not None]

    def __len__(self) -> int:
        return sum(1 for r in self._routes.values() if r.entry is not None)

    def keys_for_session(self, session_id: str) -> list[str]:
        return [
            k
            for k, r in self._routes.items()
            if r.entry is not None and r.entry.session_id == session_id
        ]

    def put(self, key: str, entry: IndexEntry) -> None:
        route = self._routes.setdefault(key, _Route(None))
        route.entry, route.dirty = entry, True

    def touch(self, key: str, now: float | None = None) -> None:
        route = self._routes.get(key)
        if route is not None and route.entry is not None:
            at = time.time() if now is None else now
            route.entry, route.dirty = replace(route.entry, updated_at=at), True

    def remove(self, key: str) -> IndexEntry | None:
        route = self._routes.get(key)
        if route is None or route.entry is None:
            return None
        entry, route.entry, route.dirty = route.entry, None, True
        return entry

    async def close(self) -> None:
        return None  # every change was written when its lease was freed
