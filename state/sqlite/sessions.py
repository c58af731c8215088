"""Write operations on sessions: create, end/reopen, titles, counters, routing fields.

Each function takes the writer's sqlite3 connection and runs inside the writer's
transaction, so checks and updates in one function are atomic.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from typing import Any, cast

from ..columns import ROUTING_FIELDS, TOKEN_FIELDS, session_fields  # noqa: F401
from ..creation import Creation
from ..errors import SessionExists, SessionNotFound, TitleEmpty, TitleTaken, TitleTooLong
from ..ids import new_session_id
from ..records import SessionRow
from ..rows import like_escape, row_dict
from ..titles import (  # sanitize_title stays importable from here
    MAX_TITLE_LENGTH,
    clean_title,
    lineage_key,
    lineage_title,
    sanitize_title,
    split_lineage,
    title_key,
)
from ..vocab import CHILD_KINDS, END_REASONS, ChildKind, EndReason  # noqa: F401
from .dispatch import Dispatch


def insert_session(
    conn: sqlite3.Connection, fields: Mapping[str, Any], *, if_missing: bool = False
) -> bool:
    """Insert a session row; returns False when `if_missing` and it already existed."""
    cols = dict(fields)
    cols.setdefault("started_at", time.time())
    cols.setdefault("last_active", cols["started_at"])
    for name in ("message_count", "tool_call_count", *TOKEN_FIELDS):
        cols.setdefault(name, 0)
    if isinstance(cols.get("model_config"), (dict, list)):
        cols["model_config"] = json.dumps(cols["model_config"], ensure_ascii=False)
    if isinstance(cols.get("origin_json"), dict):
        cols["origin_json"] = json.dumps(cols["origin_json"], ensure_ascii=False)
    if cols.get("child_kind") is not None and cols["child_kind"] not in CHILD_KINDS:
        raise ValueError(f"child_kind must be one of {', '.join(CHILD_KINDS)}")
    title = cols.pop("title", None)
    names = ", ".join(cols)
    marks = ", ".join("?" for _ in cols)
    verb = "INSERT OR IGNORE" if if_missing else "INSERT"
    try:
        cur = conn.execute(f"{verb} INTO sessions ({names}) VALUES ({marks})", tuple(cols.values()))
    except sqlite3.IntegrityError as exc:
        raise SessionExists(str(cols.get("id"))) from exc
    if cur.rowcount == 0:
        return False
    if title is not None:
        set_title(conn, cols["id"], title)
    return True


def fresh_session_id(conn: sqlite3.Connection, *, terminal: bool) -> str:
    """A generated id that no session has yet. The random tail is 32 bits per second (24
    for terminal ids), so a burst of thousands of new sessions in one second can repeat
    one; inside the write transaction the check cannot race."""
    while True:
        sid = new_session_id(terminal=terminal)
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is None:
            return sid


def insert_new_session(conn: sqlite3.Connection, fields: Mapping[str, Any], terminal: bool) -> str:
    """Insert a session under a fresh generated id; returns the id."""
    sid = fresh_session_id(conn, terminal=terminal)
    insert_session(conn, {**fields, "id": sid})
    return sid


def require_session(conn: sqlite3.Connection, session_id: str) -> None:
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        raise SessionNotFound(session_id)


def get_session(conn: sqlite3.Connection, session_id: str) -> SessionRow | None:
    cur = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,))
    row = cur.fetchone()
    return cast(SessionRow, row_dict(cur, row)) if row else None


def end_session(
    conn: sqlite3.Connection, session_id: str, reason: str, now: float | None = None
) -> bool:
    """End a live session. The first end wins: returns False if it had already ended."""
    # Any non-empty text: Hermes Agent and other writers of a shared file record their own
    # reasons; END_REASONS are the ones switchboard itself uses.
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("end_reason must be a non-empty string")
    cur = conn.execute(
        "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
        (time.time() if now is None else now, reason, session_id),
    )
    if cur.rowcount == 0:
        require_session(conn, session_id)
        return False
    return True


def reopen_session(conn: sqlite3.Connection, session_id: str) -> bool:
    cur = conn.execute(
        "UPDATE sessions SET ended_at = NULL, end_reason = NULL WHERE id = ? AND ended_at IS NOT NULL",
        (session_id,),
    )
    if cur.rowcount == 0:
        require_session(conn, session_id)
        return False
    return True


def update_system_prompt(conn: sqlite3.Connection, session_id: str, prompt: str | None) -> None:
    cur = conn.execute("UPDATE sessions SET system_prompt = ? WHERE id = ?", (prompt, session_id))
    if cur.rowcount == 0:
        raise SessionNotFound(session_id)


def update_fields(conn: sqlite3.Connection, session_id: str, fields: Mapping[str, Any]) -> None:
    bad = [k for k in fields if k not in ROUTING_FIELDS]
    if bad:
        raise ValueError(f"not updatable: {', '.join(bad)}")
    if not fields:
        return
    values = [
        json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v
        for v in fields.values()
    ]
    assignments = ", ".join(f"{k} = ?" for k in fields)
    cur = conn.execute(f"UPDATE sessions SET {assignments} WHERE id = ?", (*values, session_id))
    if cur.rowcount == 0:
        raise SessionNotFound(session_id)


# --- titles ---------------------------------------------------------------------------


def title_owner(conn: sqlite3.Connection, title: str) -> str | None:
    row = conn.execute(
        "SELECT id FROM sessions WHERE title_key = ? LIMIT 1", (title_key(title),)
    ).fetchone()
    return row[0] if row else None


def set_title(conn: sqlite3.Connection, session_id: str, raw: str | None) -> str | None:
    """Set (or with None/'' clear) a session title; returns the stored title."""
    if raw is None or not clean_title(raw):
        if raw is not None and raw.strip() and not clean_title(raw):
            raise TitleEmpty()
        cur = conn.execute(
            "UPDATE sessions SET title = NULL, title_key = NULL, title_base = NULL, "
            "title_number = NULL WHERE id = ?",
            (session_id,),
        )
        if cur.rowcount == 0:
            raise SessionNotFound(session_id)
        return None
    title = sanitize_title(raw)
    owner = title_owner(conn, title)
    if owner is not None and owner != session_id:
        raise TitleTaken(title, owner)
    try:
        base_key, number = lineage_key(title)
        cur = conn.execute(
            "UPDATE sessions SET title = ?, title_key = ?, title_base = ?, title_number = ? "
            "WHERE id = ?",
            (title, title_key(title), base_key, number, session_id),
        )
    except sqlite3.IntegrityError as exc:  # exact duplicate written by another program
        raise TitleTaken(title, "another session") from exc
    if cur.rowcount == 0:
        raise SessionNotFound(session_id)
    return title


def set_title_if_unset(conn: sqlite3.Connection, session_id: str, raw: str) -> str | None:
    """An automatic title: only if the session has none (a user's title always wins), and
    numbered (`x #2`) when the name is taken. Returns the title set, or None."""
    row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    if row[0] is not None:
        return None
    try:
        title = sanitize_title(raw[:MAX_TITLE_LENGTH])
    except (TitleEmpty, TitleTooLong):
        return None
    if title_owner(conn, title) is not None:
        title = next_title_in_lineage(conn, title)
    return set_title(conn, session_id, title)


def next_title_in_lineage(conn: sqlite3.Connection, title: str) -> str:
    """`x` -> `x #2` -> `x #3`: one past the highest number in the lineage (an index
    lookup on title_base, so naming the ten-thousandth "hello #N" costs what the second did)."""
    base, _ = split_lineage(clean_title(title))
    top = (
        conn.execute(
            "SELECT MAX(title_number) FROM sessions WHERE title_base = ?", (title_key(base),)
        ).fetchone()[0]
        or 0
    )
    while True:
        top += 1
        candidate = lineage_title(base, top)
        if len(candidate) > MAX_TITLE_LENGTH:  # keep the number, shorten the base
            suffix = f" #{top}"
            candidate = base[: MAX_TITLE_LENGTH - len(suffix)].rstrip() + suffix
        # titles written by other programs may not carry title_base: skip any taken one
        if title_owner(conn, candidate) is None:
            return candidate


def resolve_title(conn: sqlite3.Connection, raw: str) -> str | None:
    """Title -> session id: an explicit ` #N` is exact; otherwise the newest of its lineage."""
    title = clean_title(raw)
    if not title:
        return None
    base, _ = split_lineage(title)
    if title != base:  # an explicit " #N" names exactly that member
        return title_owner(conn, title)
    row = conn.execute(
        "SELECT id FROM sessions WHERE title_base = ? ORDER BY title_number DESC, started_at DESC LIMIT 1",
        (title_key(base),),
    ).fetchone()
    return str(row[0]) if row else title_owner(conn, title)


# --- lookups shared with the write path ------------------------------------------------


def resolve_id(conn: sqlite3.Connection, ref: str) -> str:
    """Exact id, else a unique id prefix. Raises SessionNotFound / AmbiguousSession."""
    from ..errors import AmbiguousSession

    ref = ref.strip()
    if not ref:
        raise SessionNotFound(ref)
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (ref,)).fetchone():
        return ref
    rows = conn.execute(
        "SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\' ORDER BY id LIMIT 6",
        (like_escape(ref) + "%",),
    ).fetchall()
    if not rows:
        raise SessionNotFound(ref)
    if len(rows) > 1:
        raise AmbiguousSession(ref, [r[0] for r in rows])
    return str(rows[0][0])


def resolve_ref(conn: sqlite3.Connection, ref: str) -> str:
    """Id, unique id prefix, or title (the newest of its lineage)."""
    try:
        return resolve_id(conn, ref)
    except SessionNotFound:
        by_title = resolve_title(conn, ref)
        if by_title is None:
            raise
        return by_title


def get_by_title(conn: sqlite3.Connection, title: str) -> SessionRow | None:
    owner = title_owner(conn, clean_title(title))
    return get_session(conn, owner) if owner else None


def count_sessions(conn: sqlite3.Connection, source: str | None = None) -> int:
    """Every session, or those of one source."""
    if source:
        (n,) = conn.execute("SELECT COUNT(*) FROM sessions WHERE source = ?", (source,)).fetchone()
    else:
        (n,) = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
    return int(n)


class SessionOps(Creation, Dispatch):
    """SessionDB's sessions: create, read, end/reopen, resolve references, titles."""

    async def _insert(self, fields: dict[str, Any]) -> None:
        await self._write(insert_session, fields)

    async def _insert_new(self, fields: dict[str, Any], cli: bool) -> str:
        return await self._write(insert_new_session, fields, cli)

    async def _insert_if_missing(self, fields: dict[str, Any]) -> bool:
        def write(conn: sqlite3.Connection) -> bool:
            return insert_session(conn, fields, if_missing=True)

        return await self._write(write)

    async def get_session(self, session_id: str) -> SessionRow | None:
        return await self._read(get_session, session_id)

    async def end_session(self, session_id: str, reason: str, *, now: float | None = None) -> bool:
        return await self._write(end_session, session_id, reason, now)

    async def reopen_session(self, session_id: str) -> bool:
        return await self._write(reopen_session, session_id)

    async def resolve_session_id(self, ref: str) -> str:
        """Exact id or unique prefix (raises SessionNotFound / AmbiguousSession)."""
        return await self._read(resolve_id, ref)

    async def resolve_session_ref(self, ref: str) -> str:
        """Id, unique id prefix, or title (newest of its lineage)."""
        return await self._read(resolve_ref, ref)

    async def update_system_prompt(self, session_id: str, prompt: str | None) -> None:
        await self._write(update_system_prompt, session_id, prompt)

    async def update_session(self, session_id: str, **fields: Any) -> None:
        """Set routing/handoff/billing columns (see ROUTING_FIELDS)."""
        await self._write(update_fields, session_id, fields)

    async def session_count(self, source: str | None = None) -> int:
        return await self._read(count_sessions, source)

    async def set_session_title(self, session_id: str, title: str | None) -> str | None:
        """Set (or clear with None/'') the title; raises TitleTooLong/TitleTaken/TitleEmpty."""
        return await self._write(set_title, session_id, title)

    async def set_title_if_unset(self, session_id: str, title: str) -> str | None:
        """Set an automatic title unless one is set; numbered when taken."""
        return await self._write(set_title_if_unset, session_id, title)

    async def get_session_by_title(self, title: str) -> SessionRow | None:
        return await self._read(get_by_title, title)

    async def resolve_session_by_title(self, title: str) -> str | None:
        return await self._read(resolve_title, title)

    async def get_next_title_in_lineage(self, title: str) -> str:
        return await self._read(next_title_in_lineage, title)
