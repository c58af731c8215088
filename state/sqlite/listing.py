"""Listing sessions for people: newest activity first, one page at a time.

The query walks `idx_sessions_last_active` (or the per-source index) and stops after the
page, so its cost follows the page size, not the number of sessions or messages.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..records import SessionRow
from ..rows import row_dict
from .sessions import ChildKind, EndReason

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
        for col, value in (("user_id", self.user_id), ("chat_id", self.chat_id),
                           ("thread_id", self.thread_id)):  # fmt: skip
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
        f"WHERE fold.parent_session_id = {outer} AND fold.child_kind = '{ChildKind.COMPRESSION}')"
    )
    return (
        f"({p}ended_at IS NULL OR (({p}parent_session_id IS NULL OR {p}child_kind IN ({names})) "
        f"AND NOT ({continued})))"
    )


def list_sessions(
    conn: sqlite3.Connection, flt: SessionFilter, limit: int = 20, offset: int = 0
) -> list[SessionRow]:
    where, params = flt.where()
    cur = conn.execute(
        f"SELECT {LIST_COLUMNS} FROM sessions WHERE {where} "
        "ORDER BY last_active DESC, id DESC LIMIT ? OFFSET ?",
        (*params, max(0, limit), max(0, offset)),
    )
    return [cast(SessionRow, with_chat_name(row_dict(cur, r))) for r in cur.fetchall()]


def sessions_by_start(
    conn: sqlite3.Connection, source: str | None, limit: int, offset: int
) -> list[SessionRow]:
    """Every session (children too), newest start first, whole rows: Hermes Agent's
    `search_sessions` listing."""
    where, params = ("WHERE source = ? ", [source]) if source else ("", [])
    cur = conn.execute(
        f"SELECT * FROM sessions {where}ORDER BY started_at DESC, id DESC LIMIT ? OFFSET ?",
        [*params, max(0, limit), max(0, offset)],
    )
    return [cast(SessionRow, row_dict(cur, r)) for r in cur.fetchall()]


def resolve_in_scope(conn: sqlite3.Connection, ref: str, flt: SessionFilter) -> str | None:
    """Id, unique id prefix or title (newest of its lineage) among the sessions `flt`
    allows. Sessions outside the scope are invisible: they never match, never make a
    prefix ambiguous, never show up in an error."""
    from ..errors import AmbiguousSession
    from ..rows import like_escape
    from ..titles import title_key
    from .sessions import clean_title, split_lineage

    ref = ref.strip()
    if not ref:
        return None
    where, params = flt.where()
    row = conn.execute(
        f"SELECT id FROM sessions WHERE id = ? AND {where}", (ref, *params)
    ).fetchone()
    if row:
        return str(row[0])
    rows = conn.execute(
        f"SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\' AND {where} ORDER BY id LIMIT 6",
        (like_escape(ref) + "%", *params),
    ).fetchall()
    if len(rows) > 1:
        raise AmbiguousSession(ref, [r[0] for r in rows])
    if rows:
        return str(rows[0][0])
    title = clean_title(ref)
    if not title:
        return None
    base, _ = split_lineage(title)
    if title != base:  # an explicit " #N": exactly that member
        row = conn.execute(
            f"SELECT id FROM sessions WHERE title_key = ? AND {where}", (title_key(title), *params)
        ).fetchone()
        return str(row[0]) if row else None
    row = conn.execute(
        f"SELECT id FROM sessions WHERE title_base = ? AND {where} "
        "ORDER BY title_number DESC, started_at DESC LIMIT 1",
        (title_key(base), *params),
    ).fetchone()
    if row:
        return str(row[0])
    row = conn.execute(
        f"SELECT id FROM sessions WHERE title_key = ? AND {where}", (title_key(title), *params)
    ).fetchone()
    return str(row[0]) if row else None


def count_sessions(conn: sqlite3.Connection, flt: SessionFilter) -> int:
    where, params = flt.where()
    return int(conn.execute(f"SELECT COUNT(*) FROM sessions WHERE {where}", params).fetchone()[0])
