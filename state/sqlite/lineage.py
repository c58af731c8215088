"""Lineage: ancestors, descendants, the compression tip, the resume target, forking a
child (branch, compression, reset) and replaying a conversation across its ancestors."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from ..errors import SessionNotFound
from ..records import SessionRow
from ..rows import row_dict
from ..vocab import INHERITED_COLUMNS, MAX_LINEAGE_DEPTH, ChildKind, is_compression_child
from . import messages, sessions
from .dispatch import Dispatch


def ancestors(conn: sqlite3.Connection, session_id: str) -> list[SessionRow]:
    """Parent, grandparent, ... (nearest first)."""
    out: list[SessionRow] = []
    seen = {session_id}
    current = session_id
    for _ in range(MAX_LINEAGE_DEPTH):
        row = conn.execute(
            "SELECT p.* FROM sessions c JOIN sessions p ON p.id = c.parent_session_id "
            "WHERE c.id = ?",
            (current,),
        )
        found = row.fetchone()
        if found is None:
            break
        parent = cast(SessionRow, row_dict(row, found))
        if parent["id"] in seen:
            break
        seen.add(parent["id"])
        out.append(parent)
        current = parent["id"]
    return out


def children(
    conn: sqlite3.Connection, session_id: str, kind: str | None = None
) -> list[SessionRow]:
    sql = "SELECT * FROM sessions WHERE parent_session_id = ?"
    params: tuple[str, ...] = (session_id,)
    if kind is not None:
        sql += " AND child_kind IS ?"
        params = (session_id, kind)
    cur = conn.execute(sql + " ORDER BY started_at, id", params)
    return [cast(SessionRow, row_dict(cur, r)) for r in cur.fetchall()]


def descendants(conn: sqlite3.Connection, session_id: str) -> list[SessionRow]:
    """Every session that grew from this one, breadth first, each with its `depth`."""
    cur = conn.execute(
        """WITH RECURSIVE tree(id, depth) AS (
               SELECT id, 1 FROM sessions WHERE parent_session_id = ?
               UNION
               SELECT s.id, t.depth + 1 FROM sessions s JOIN tree t ON s.parent_session_id = t.id
               WHERE t.depth < ?)
           SELECT s.*, MIN(tree.depth) AS depth FROM tree JOIN sessions s ON s.id = tree.id
           GROUP BY s.id ORDER BY depth, s.started_at""",
        (session_id, MAX_LINEAGE_DEPTH),
    )
    return [cast(SessionRow, row_dict(cur, r)) for r in cur.fetchall()]


def compression_tip(conn: sqlite3.Connection, session_id: str) -> str:
    """Follow compression continuations (newest at each step) to the live tip."""
    current = session_id
    seen = {current}
    for _ in range(MAX_LINEAGE_DEPTH):
        rows = conn.execute(
            "SELECT c.id, c.child_kind, p.end_reason FROM sessions c "
            "JOIN sessions p ON p.id = c.parent_session_id WHERE c.parent_session_id = ? "
            "ORDER BY c.started_at DESC, c.id DESC",
            (current,),
        ).fetchall()
        nxt = next((cid for cid, kind, reason in rows if is_compression_child(kind, reason)), None)
        if nxt is None or nxt in seen:
            return current
        seen.add(nxt)
        current = nxt
    return current


def resume_target(conn: sqlite3.Connection, session_id: str) -> str:
    """Where /resume lands: the compression tip, so a compressed (and therefore emptied
    from the chat's point of view) parent resolves to the child holding the live messages."""
    return compression_tip(conn, session_id)


def fork(
    conn: sqlite3.Connection,
    parent_id: str,
    kind: str,
    new_id: str | None,
    title: str | None,
    copy_messages: bool,
    seeds: Sequence[Mapping[str, Any]],
    end_reason: str | None,
    routing: Mapping[str, Any],
) -> str:
    """Create a child of `parent_id` in one transaction: copy or seed its messages, title
    it (an explicit title, else the next `#N` of the parent's title for compression and
    branch), and end the parent with `end_reason`. Returns the child's id."""
    parent = sessions.get_session(conn, parent_id)
    if parent is None:
        raise SessionNotFound(parent_id)
    cid = new_id or sessions.fresh_session_id(conn, terminal=parent["source"] == "cli")
    fields: dict[str, Any] = {
        "id": cid,
        "source": parent["source"],
        "parent_session_id": parent_id,
        "child_kind": kind,
    }
    inherited: Mapping[str, Any] = parent
    for col in INHERITED_COLUMNS:
        if inherited.get(col) is not None:
            fields[col] = inherited[col]
    fields.update({k: v for k, v in routing.items() if v is not None})
    sessions.insert_session(conn, fields)
    parent_title = parent.get("title")
    if title is not None:
        sessions.set_title(conn, cid, title)
    elif parent_title and kind in (ChildKind.COMPRESSION, ChildKind.BRANCH):
        sessions.set_title(conn, cid, sessions.next_title_in_lineage(conn, parent_title))
    if copy_messages:
        history = messages.get_messages(conn, parent_id)
        messages.append_messages(
            conn,
            cid,
            [{k: v for k, v in m.items() if k in messages.MESSAGE_FIELDS} for m in history],
        )
    if seeds:
        messages.append_messages(conn, cid, seeds)
    if end_reason is not None:
        sessions.end_session(conn, parent_id, end_reason)
    return cid


def conversation(
    conn: sqlite3.Connection, session_id: str, include_ancestors: bool, last: int | None
) -> list[dict[str, Any]]:
    """The session's messages in OpenAI chat format, after its ancestors' (oldest first)
    when `include_ancestors`; `last` limits the session's own part."""
    rows: list[dict[str, Any]] = []
    if include_ancestors:
        for anc in reversed(ancestors(conn, session_id)):
            rows.extend(messages.conversation(conn, anc["id"]))
    rows.extend(messages.conversation(conn, session_id, last))
    return rows


class LineageOps(Dispatch):
    """SessionDB's lineage: ancestors, descendants, children, the compression tip, forks."""

    async def get_messages_as_conversation(
        self, session_id: str, *, include_ancestors: bool = False, last: int | None = None
    ) -> list[dict[str, Any]]:
        return await self._read(conversation, session_id, include_ancestors, last)

    async def get_ancestors(self, session_id: str) -> list[SessionRow]:
        return await self._read(ancestors, session_id)

    async def get_descendants(self, session_id: str) -> list[SessionRow]:
        return await self._read(descendants, session_id)

    async def get_children(self, session_id: str, kind: str | None = None) -> list[SessionRow]:
        return await self._read(children, session_id, kind)

    async def get_compression_tip(self, session_id: str) -> str:
        return await self._read(compression_tip, session_id)

    async def resolve_resume_session_id(self, session_id: str) -> str:
        return await self._read(resume_target, session_id)

    async def fork_session(
        self,
        parent_id: str,
        kind: str,
        *,
        new_id: str | None = None,
        title: str | None = None,
        copy_messages: bool = False,
        seed_messages: Iterable[Mapping[str, Any]] = (),
        end_reason: str | None = None,
        **routing: Any,
    ) -> str:
        """Create a child of `parent_id` in one transaction: copy or seed its messages,
        title it (an explicit title, else the next `#N` of the parent's title for
        compression/branch), and end the parent with `end_reason`."""
        return await self._write(
            fork,
            parent_id,
            kind,
            new_id,
            title,
            copy_messages,
            list(seed_messages),
            end_reason,
            routing,
        )
