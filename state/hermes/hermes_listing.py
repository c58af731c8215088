"""Rich session listing in Hermes Agent's shape, for `state.hermes.compat`: whole rows with a
preview and the last activity computed at read time (so rows any program wrote count),
Hermes's visibility rules (branches shown, delegate subagents hidden), compression-tip
projection, ordering by activity across a compression chain, id/title search, compact rows.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..content import content_text
from ..rows import Row, row_dict
from .hermes_sessions import cwd_prefix_clause

PREVIEW_CHARS = 60
# Fields a compressed root takes from its live tip when projected.
TIP_FIELDS = (
    "id",
    "ended_at",
    "end_reason",
    "message_count",
    "tool_call_count",
    "title",
    "last_active",
    "preview",
    "model",
    "system_prompt",
    "cwd",
    "git_branch",
    "git_repo_root",
)

_LAST_ACTIVE = (
    "COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id), s.started_at)"
)
_FIRST_USER = (
    "(SELECT m.content FROM messages m WHERE m.session_id = s.id AND m.role = 'user' "
    "AND m.content IS NOT NULL AND m.content != '' ORDER BY m.timestamp, m.id LIMIT 1)"
)
_DELEGATE = (
    "(json_valid(s.model_config) AND json_extract(s.model_config, '$._delegate_from') IS NOT NULL)"
)
_BRANCH = (
    "(s.child_kind = 'branch' OR (json_valid(s.model_config) "
    "AND json_extract(s.model_config, '$._branched_from') IS NOT NULL) "
    "OR EXISTS (SELECT 1 FROM sessions p WHERE p.id = s.parent_session_id "
    "AND p.end_reason = 'branched' AND p.ended_at <= s.started_at))"
)


def preview(stored: Any) -> str:
    text = content_text(stored)
    if not text:
        return ""
    flat = text.replace("\r", " ").replace("\n", " ").strip()
    return flat[:PREVIEW_CHARS] + "..." if len(flat) > PREVIEW_CHARS else flat


@dataclass(frozen=True)
class RichQuery:
    source: str | None = None
    exclude_sources: Sequence[str] = ()
    cwd_prefix: str | None = None
    limit: int = 20
    offset: int = 0
    include_children: bool = False
    min_message_count: int | None = None
    project_compression_tips: bool = True
    order_by_last_active: bool = False
    include_archived: bool = False
    archived_only: bool = False
    id_query: str | None = None
    search_query: str | None = None
    compact_rows: bool = False


def _rows(conn: sqlite3.Connection, where: str, params: Sequence[Any], tail: str = "") -> list[Row]:
    cur = conn.execute(
        f"SELECT s.*, {_LAST_ACTIVE} AS _la, {_FIRST_USER} AS _fu FROM sessions s "
        f"WHERE {where} {tail}",
        tuple(params),
    )
    out = []
    for raw in cur.fetchall():
        row = row_dict(cur, raw)
        row["last_active"] = row.pop("_la")
        row["preview"] = preview(row.pop("_fu"))
        out.append(row)
    return out


def session_row(conn: sqlite3.Connection, session_id: str) -> Row | None:
    rows = _rows(conn, "s.id = ?", [session_id])
    return rows[0] if rows else None


def _chain(conn: sqlite3.Connection, root: str) -> list[str]:
    """Ids from `root` forward through compression continuations to the tip."""
    ids = [root]
    current = root
    for _ in range(100):
        nxt = _next_in_chain(conn, current)
        if nxt is None or nxt in ids:
            break
        ids.append(nxt)
        current = nxt
    return ids


def _next_in_chain(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The newest session continuing `session_id` after a compression, if any."""
    row = conn.execute(
        "SELECT c.id FROM sessions c JOIN sessions p ON p.id = c.parent_session_id "
        "WHERE c.parent_session_id = ? AND (p.end_reason = 'compression' "
        "OR c.child_kind = 'compression') ORDER BY c.started_at DESC, c.id DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    return str(row[0]) if row else None


def _project(conn: sqlite3.Connection, row: Row) -> tuple[Row, list[str]]:
    chain = _chain(conn, row["id"]) if row.get("end_reason") == "compression" else [row["id"]]
    if len(chain) == 1:
        return row, chain
    tip = session_row(conn, chain[-1])
    if tip is None:
        return row, chain
    out = dict(row)
    for key in TIP_FIELDS:
        out[key] = tip.get(key)
    out["_lineage_root_id"] = row["id"]
    return out, chain


def _normal(text: str) -> str:
    return re.sub(r"[^\w]+", "", text.lower())


def list_rich(conn: sqlite3.Connection, q: RichQuery) -> list[Row]:
    where, params = ["1"], []  # type: list[str], list[Any]
    if q.source:
        where.append("s.source = ?")
        params.append(q.source)
    if q.exclude_sources:
        where.append(f"s.source NOT IN ({', '.join('?' for _ in q.exclude_sources)})")
        params += list(q.exclude_sources)
    clause, values = cwd_prefix_clause(q.cwd_prefix, "s.cwd")
    if clause:
        where.append(clause.removeprefix(" AND "))
        params += values
    if q.min_message_count is not None:
        where.append("COALESCE(s.message_count, 0) >= ?")
        params.append(q.min_message_count)
    if q.archived_only:
        where.append("COALESCE(s.archived, 0) = 1")
    elif not q.include_archived:
        where.append("COALESCE(s.archived, 0) = 0")
    if not q.include_children:
        where.append(f"NOT {_DELEGATE}")
        where.append(f"(s.parent_session_id IS NULL OR {_BRANCH})")
    project = q.project_compression_tips and not q.include_children
    if not q.order_by_last_active:
        rows = _rows(
            conn,
            " AND ".join(where),
            [*params, q.limit, q.offset],
            "ORDER BY s.started_at DESC, s.id DESC LIMIT ? OFFSET ?",
        )
        out = [_project(conn, r)[0] if project else r for r in rows]
    else:
        rows = _rows(conn, " AND ".join(where), params)
        ranked = []
        for r in rows:
            shown, chain = _project(conn, r) if project else (r, [r["id"]])
            if not _matches(conn, q, chain):
                continue
            activity = max(
                (x["last_active"] or 0) for x in (session_row(conn, c) for c in chain) if x
            )
            ranked.append(((activity, r["started_at"] or 0, r["id"]), shown))
        ranked.sort(key=lambda t: t[0], reverse=True)
        out = [shown for _, shown in ranked][q.offset : q.offset + q.limit]
    if q.compact_rows:
        for r in out:
            r.pop("system_prompt", None)
    return out


def _matches(conn: sqlite3.Connection, q: RichQuery, chain: list[str]) -> bool:
    if q.id_query and not any(q.id_query.lower() in c.lower() for c in chain):
        return False
    if q.search_query:
        needle = q.search_query.lower()
        if any(needle in c.lower() for c in chain):
            return True
        marks = ", ".join("?" for _ in chain)
        titles = [
            t
            for (t,) in conn.execute(
                f"SELECT title FROM sessions WHERE id IN ({marks}) AND title IS NOT NULL", chain
            )
        ]
        return any(needle in t.lower() or _normal(needle) in _normal(t) for t in titles)
    return True
