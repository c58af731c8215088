"""Lineage queries: ancestors, descendants, the compression tip and the resume target."""

from __future__ import annotations

import sqlite3

from .rows import Row, row_dict
from .sessions import ChildKind, EndReason

_MAX_DEPTH = 10_000  # guards against a parent cycle written by another program


def ancestors(conn: sqlite3.Connection, session_id: str) -> list[Row]:
    """Parent, grandparent, ... (nearest first)."""
    out: list[Row] = []
    seen = {session_id}
    current = session_id
    for _ in range(_MAX_DEPTH):
        row = conn.execute(
            "SELECT p.* FROM sessions c JOIN sessions p ON p.id = c.parent_session_id "
            "WHERE c.id = ?",
            (current,),
        )
        found = row.fetchone()
        if found is None:
            break
        parent = row_dict(row, found)
        if parent["id"] in seen:
            break
        seen.add(parent["id"])
        out.append(parent)
        current = parent["id"]
    return out


def children(conn: sqlite3.Connection, session_id: str, kind: str | None = None) -> list[Row]:
    sql = "SELECT * FROM sessions WHERE parent_session_id = ?"
    params: tuple[str, ...] = (session_id,)
    if kind is not None:
        sql += " AND child_kind IS ?"
        params = (session_id, kind)
    cur = conn.execute(sql + " ORDER BY started_at, id", params)
    return [row_dict(cur, r) for r in cur.fetchall()]


def descendants(conn: sqlite3.Connection, session_id: str) -> list[Row]:
    """Every session that grew from this one, breadth first, each with its `depth`."""
    cur = conn.execute(
        """WITH RECURSIVE tree(id, depth) AS (
               SELECT id, 1 FROM sessions WHERE parent_session_id = ?
               UNION
               SELECT s.id, t.depth + 1 FROM sessions s JOIN tree t ON s.parent_session_id = t.id
               WHERE t.depth < ?)
           SELECT s.*, MIN(tree.depth) AS depth FROM tree JOIN sessions s ON s.id = tree.id
           GROUP BY s.id ORDER BY depth, s.started_at""",
        (session_id, _MAX_DEPTH),
    )
    return [row_dict(cur, r) for r in cur.fetchall()]


def _is_compression_child(kind: str | None, end_reason: str | None) -> bool:
    # Rows written by other programs carry no child_kind; their parent's end_reason
    # ('compression') says what the child is.
    return kind == ChildKind.COMPRESSION or (kind is None and end_reason == EndReason.COMPRESSION)


def compression_tip(conn: sqlite3.Connection, session_id: str) -> str:
    """Follow compression continuations (newest at each step) to the live tip."""
    current = session_id
    seen = {current}
    for _ in range(_MAX_DEPTH):
        rows = conn.execute(
            "SELECT c.id, c.child_kind, p.end_reason FROM sessions c "
            "JOIN sessions p ON p.id = c.parent_session_id WHERE c.parent_session_id = ? "
            "ORDER BY c.started_at DESC, c.id DESC",
            (current,),
        ).fetchall()
        nxt = next((cid for cid, kind, reason in rows if _is_compression_child(kind, reason)), None)
        if nxt is None or nxt in seen:
            return current
        seen.add(nxt)
        current = nxt
    return current


def resume_target(conn: sqlite3.Connection, session_id: str) -> str:
    """Where /resume lands: the compression tip, so a compressed (and therefore emptied
    from the chat's point of view) parent resolves to the child holding the live messages."""
    return compression_tip(conn, session_id)
