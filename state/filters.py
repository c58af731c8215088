"""Which sessions a listing or a search shows, as SQL both stores run: `SessionFilter`
(source, owner, chat, thread, archived, titled), the folded-lineage rule of the default
listings, and the listing's columns with each row's chat name. The placeholder is the
caller's (`?` for SQLite, `%s` for PostgreSQL)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .records import SessionRow
from .vocab import ChildKind, EndReason

LIST_COLUMNS = (
    "id, source, user_id, model, title, started_at, ended_at, end_reason, message_count, "
    "parent_session_id, child_kind, last_active, preview, session_key, chat_id, chat_type, "
    "thread_id, archived, handoff_state, origin_json"
)


def with_chat_name(row: dict[str, Any]) -> dict[str, Any]:
    """A listing row with `chat_name` (the chat's display name as its platform or the API
    caller gave it, None when there is none) in place of the origin JSON it comes from."""
    raw = row.pop("origin_json", None)
    try:
        origin = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:  # written by another program: a listing never fails on it
        origin = None
    name = origin.get("chat_name") if isinstance(origin, dict) else None
    row["chat_name"] = str(name) if name not in (None, "") else None
    return row


@dataclass(frozen=True)
class SessionFilter:
    """Who and what a listing (or a search) may show."""

    source: str | None = None
    sources: Sequence[str] = ()
    exclude_sources: Sequence[str] = ()
    user_id: str | None = None
    chat_id: str | None = None
    thread_id: str | None = None
    include_children: bool = False  # False: the folded listing (see `folded_lineage`)
    include_archived: bool = False
    titled_only: bool = False
    thread_exact: bool = False  # thread_id None then means "not in a thread"
    child_kinds: tuple[str, ...] = (ChildKind.BRANCH,)  # children shown beside roots by default
    routed_only: bool = False  # only sessions that came from a chat (have a session key)

    def where(self, alias: str = "", mark: str = "?") -> tuple[str, list[object]]:
        """(SQL condition, parameters) with `mark` as the placeholder (`%s` for
        PostgreSQL); "1" (SQLite) or "TRUE" when nothing is filtered."""
        p = f"{alias}." if alias else ""
        clauses: list[str] = []
        params: list[object] = []
        wanted = [*self.sources, *([self.source] if self.source else [])]
        if wanted:
            clauses.append(f"{p}source IN ({', '.join(mark for _ in wanted)})")
            params.extend(wanted)
        if self.exclude_sources:
            clauses.append(f"{p}source NOT IN ({', '.join(mark for _ in self.exclude_sources)})")
            params.extend(self.exclude_sources)
        for col, value in (
            ("user_id", self.user_id),
            ("chat_id", self.chat_id),
            ("thread_id", self.thread_id),
        ):
            if value is not None:
                clauses.append(f"{p}{col} = {mark}")
                params.append(value)
        if self.thread_exact and self.thread_id is None:
            clauses.append(f"{p}thread_id IS NULL")
        if self.routed_only:
            clauses.append(f"{p}session_key IS NOT NULL")
        if not self.include_children:
            clauses.append(folded_lineage(alias, self.child_kinds))
        if not self.include_archived:
            clauses.append(f"COALESCE({p}archived, 0) = 0")
        if self.titled_only:
            clauses.append(f"{p}title IS NOT NULL")
        return (" AND ".join(clauses) or ("1" if mark == "?" else "TRUE")), params


def folded_lineage(alias: str = "", kinds: Sequence[str] = (ChildKind.BRANCH,)) -> str:
    """The default listings' rule, as an SQL condition both stores run: every live session;
    roots and children of `kinds`; the tip of each compression chain. Ended compression
    and reset children are reached through their lineage, and an ancestor a compression
    continues is folded into its continuation. A live session is never folded."""
    p = f"{alias}." if alias else ""
    outer = f"{alias}.id" if alias else "sessions.id"
    names = ", ".join(f"'{k}'" for k in (*kinds, ChildKind.COMPRESSION) if k.isalpha())
    continued = (
        f"{p}end_reason = '{EndReason.COMPRESSION}' AND EXISTS (SELECT 1 FROM sessions fold "
        f"WHERE fold.parent_session_id = {outer} "
        # rows other programs write carry no child_kind: the parent's end_reason says it
        f"AND (fold.child_kind = '{ChildKind.COMPRESSION}' OR fold.child_kind IS NULL))"
    )
    return (
        f"({p}ended_at IS NULL OR (({p}parent_session_id IS NULL OR {p}child_kind IN ({names})) "
        f"AND NOT ({continued})))"
    )


class Listing:
    """`list_sessions` for both stores: its arguments read as a SessionFilter, then the
    backend's `list_filtered` (its SQL, in state/sqlite/listing.py or state/pg/listing.py)."""

    async def list_filtered(
        self, flt: SessionFilter, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        raise NotImplementedError

    async def list_sessions(
        self,
        source: str | None = None,
        *,
        exclude_sources: Iterable[str] = (),
        user_id: str | None = None,
        chat_id: str | None = None,
        include_children: bool = False,
        include_archived: bool = False,
        titled_only: bool = False,
        limit: int = 20,
        offset: int = 0,
    ) -> list[SessionRow]:
        """Newest activity first, each row with `last_active` and a 60-char `preview`."""
        flt = SessionFilter(
            source=source,
            exclude_sources=tuple(exclude_sources),
            user_id=user_id,
            chat_id=chat_id,
            include_children=include_children,
            include_archived=include_archived,
            titled_only=titled_only,
        )
        return await self.list_filtered(flt, limit, offset)
