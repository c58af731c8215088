"""Session operations in Hermes Agent's shapes, for `state.hermes.compat`: create as an upsert that
fills missing metadata, workspace fields, model and billing-route updates, conditional
titles. SQL functions over a connection, run inside the store's write transactions.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from ..rows import Row
from ..sqlite import sessions

# Columns a repeated create fills when they are still NULL (never overwrites).
FILLABLE = (
    "model",
    "model_config",
    "system_prompt",
    "session_key",
    "chat_id",
    "chat_type",
    "thread_id",
    "parent_session_id",
    "cwd",
    "profile_name",
)


def upsert(conn: sqlite3.Connection, fields: Mapping[str, Any]) -> str:
    """Create the session, or fill the NULL columns of an existing one. Returns the id."""
    sid = str(fields["id"])
    values = dict(fields)
    if isinstance(values.get("model_config"), (dict, list)):
        values["model_config"] = json.dumps(values["model_config"])
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is None:
        extra = {k: values.pop(k) for k in ("cwd", "profile_name") if k in values}
        sessions.insert_session(conn, values)
        if extra:
            sets = ", ".join(f"{k} = ?" for k in extra)
            conn.execute(f"UPDATE sessions SET {sets} WHERE id = ?", (*extra.values(), sid))
        return sid
    fill = {k: v for k, v in values.items() if k in FILLABLE and v is not None}
    if fill:
        sets = ", ".join(f"{k} = COALESCE({k}, ?)" for k in fill)
        conn.execute(f"UPDATE sessions SET {sets} WHERE id = ?", (*fill.values(), sid))
    return sid


def update_cwd(
    conn: sqlite3.Connection, session_id: str, cwd: str, branch: str | None, root: str | None
) -> None:
    """Always set cwd; branch and repo root only when non-blank (a failed probe keeps the old)."""
    if not session_id or not cwd:
        return
    sets, params = ["cwd = ?"], [cwd]
    for col, value in (("git_branch", branch), ("git_repo_root", root)):
        if value is not None and str(value).strip():
            sets.append(f"{col} = ?")
            params.append(str(value).strip())
    conn.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", (*params, session_id))


def distinct_cwds(conn: sqlite3.Connection, include_archived: bool) -> list[Row]:
    where = "" if include_archived else " AND COALESCE(archived, 0) = 0"
    rows = conn.execute(
        "SELECT cwd, COUNT(*), MAX(COALESCE(ended_at, started_at)) FROM sessions "
        f"WHERE cwd IS NOT NULL AND trim(cwd) != ''{where} GROUP BY cwd ORDER BY 3 DESC"
    ).fetchall()
    return [{"cwd": c, "sessions": n, "last_active": la} for c, n, la in rows]


def backfill_repo_roots(conn: sqlite3.Connection, roots: Mapping[str, str]) -> int:
    changed = 0
    for cwd, root in roots.items():
        if cwd and root:
            changed += conn.execute(
                "UPDATE sessions SET git_repo_root = ? WHERE cwd = ? "
                "AND (git_repo_root IS NULL OR git_repo_root = '')",
                (root, cwd),
            ).rowcount
    return changed


def cwd_prefix_clause(prefix: str | None, column: str = "cwd") -> tuple[str, list[Any]]:
    """SQL matching `column` equal to the prefix or below it (either separator), never a
    sibling that merely starts with the same letters."""
    if not prefix:
        return "", []
    base = prefix.rstrip("/\\") or prefix
    esc = base.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return (
        f" AND ({column} = ? OR {column} = ? OR {column} = ? OR {column} LIKE ? ESCAPE '\\' "
        f"OR {column} LIKE ? ESCAPE '\\')",
        [base, base + "/", base + "\\", esc + "/%", esc + "\\\\%"],
    )


def set_auto_title_if_empty(conn: sqlite3.Connection, session_id: str, title: str) -> bool:
    row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None or row[0] is not None:
        return False
    sessions.set_title(conn, session_id, title)
    return True


def set_archived(conn: sqlite3.Connection, session_id: str, archived: bool) -> bool:
    """Archive (or restore) a session with its compression ancestors and descendants."""
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        return False
    ids = compression_family(conn, session_id)
    marks = ", ".join("?" for _ in ids)
    cur = conn.execute(
        f"UPDATE sessions SET archived = ? WHERE id IN ({marks}) AND COALESCE(archived, 0) != ?",
        (int(bool(archived)), *ids, int(bool(archived))),
    )
    return cur.rowcount > 0


def compression_family(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """The session, the ancestors it continues and the sessions continuing it (edges are
    parents that ended with `compression`)."""
    out = [session_id, *compression_ancestors(conn, session_id)]
    seen = set(out)
    frontier = [session_id]
    while frontier:
        nxt = []
        for sid in frontier:
            for (child,) in conn.execute(
                "SELECT c.id FROM sessions c JOIN sessions p ON p.id = c.parent_session_id "
                "WHERE p.id = ? AND p.end_reason = 'compression'",
                (sid,),
            ):
                if child not in seen:
                    seen.add(child)
                    out.append(child)
                    nxt.append(child)
        frontier = nxt
    return out


def compression_ancestors(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """Parents this session continues after a compression, nearest first (cycles cut)."""
    out: list[str] = []
    seen = {session_id}
    current = session_id
    while True:
        row = conn.execute(
            "SELECT p.id FROM sessions c JOIN sessions p ON p.id = c.parent_session_id "
            "WHERE c.id = ? AND p.end_reason = 'compression'",
            (current,),
        ).fetchone()
        if row is None or row[0] in seen:
            return out
        current = row[0]
        seen.add(current)
        out.append(current)


def set_title_taking_from_ancestor(conn: sqlite3.Connection, session_id: str, title: str) -> None:
    """Set the title; when a compression ancestor holds it, it moves to this session (the
    visible tip of that conversation) instead of conflicting."""
    owner = sessions.title_owner(conn, title)
    if owner and owner != session_id and owner in compression_ancestors(conn, session_id):
        sessions.set_title(conn, owner, None)
    sessions.set_title(conn, session_id, title)


def compression_lineage(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """Ids from the root to the tip through compression edges ([id] outside a chain, []
    for an unknown id); terminates on cycles."""
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        return []
    chain = [*reversed(compression_ancestors(conn, session_id)), session_id]
    seen = set(chain)
    current = session_id
    while True:
        row = conn.execute(
            "SELECT c.id FROM sessions c JOIN sessions p ON p.id = c.parent_session_id "
            "WHERE p.id = ? AND p.end_reason = 'compression' "
            "ORDER BY c.started_at DESC, c.id DESC LIMIT 1",
            (current,),
        ).fetchone()
        if row is None or row[0] in seen:
            return chain
        current = row[0]
        seen.add(current)
        chain.append(current)
