"""Lineage on PostgreSQL: ancestors, descendants, the compression tip, forking a child and
replaying a conversation across its ancestors (state/sqlite/lineage.py's rules)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from psycopg import AsyncConnection

from ..errors import SessionNotFound
from ..records import SessionRow
from ..vocab import INHERITED_COLUMNS, MAX_LINEAGE_DEPTH, ChildKind, is_compression_child
from . import db, messages, sessions
from .dispatch import Dispatch


async def ancestors(conn: AsyncConnection, session_id: str) -> list[SessionRow]:
    out: list[SessionRow] = []
    seen = {session_id}
    current = session_id
    for _ in range(MAX_LINEAGE_DEPTH):
        parent = await db.row(
            conn,
            "SELECT p.* FROM sessions c JOIN sessions p ON p.id = c.parent_session_id WHERE c.id = %s",
            (current,),
        )
        if parent is None or parent["id"] in seen:
            break
        seen.add(parent["id"])
        out.append(cast(SessionRow, parent))
        current = parent["id"]
    return out


async def children(
    conn: AsyncConnection, session_id: str, kind: str | None = None
) -> list[SessionRow]:
    sql = "SELECT * FROM sessions WHERE parent_session_id = %s"
    params: tuple[str, ...] = (session_id,)
    if kind is not None:
        sql += " AND child_kind IS NOT DISTINCT FROM %s"
        params = (session_id, kind)
    return cast(list[SessionRow], await db.rows(conn, sql + " ORDER BY started_at, id", params))


async def descendants(conn: AsyncConnection, session_id: str) -> list[SessionRow]:
    found = await db.rows(
        conn,
        """WITH RECURSIVE tree(id, depth) AS (
               SELECT id, 1 FROM sessions WHERE parent_session_id = %s
               UNION
               SELECT s.id, t.depth + 1 FROM sessions s JOIN tree t ON s.parent_session_id = t.id
               WHERE t.depth < %s)
           SELECT s.*, d.depth FROM (SELECT id, MIN(depth) AS depth FROM tree GROUP BY id) d
           JOIN sessions s ON s.id = d.id ORDER BY d.depth, s.started_at""",
        (session_id, MAX_LINEAGE_DEPTH),
    )
    for r in found:
        r["depth"] = int(r["depth"])
    return cast(list[SessionRow], found)


async def compression_tip(conn: AsyncConnection, session_id: str) -> str:
    current = session_id
    seen = {current}
    for _ in range(MAX_LINEAGE_DEPTH):
        found = await db.tuples(
            conn,
            "SELECT c.id, c.child_kind, p.end_reason FROM sessions c "
            "JOIN sessions p ON p.id = c.parent_session_id WHERE c.parent_session_id = %s "
            "ORDER BY c.started_at DESC, c.id DESC",
            (current,),
        )
        nxt = next((cid for cid, kind, reason in found if is_compression_child(kind, reason)), None)
        if nxt is None or nxt in seen:
            return current
        seen.add(nxt)
        current = nxt
    return current


async def fork(
    conn: AsyncConnection,
    parent_id: str,
    kind: str,
    new_id: str | None,
    title: str | None,
    copy_messages: bool,
    seeds: Sequence[Mapping[str, Any]],
    end_reason: str | None,
    routing: Mapping[str, Any],
) -> str:
    """state/sqlite/lineage.py's fork, with one order change: the parent ends before the child is
    inserted, because the child inherits the session key and a key has one live session."""
    parent = await sessions.get_session(conn, parent_id)
    if parent is None:
        raise SessionNotFound(parent_id)
    fields: dict[str, Any] = {
        "source": parent["source"],
        "parent_session_id": parent_id,
        "child_kind": kind,
    }
    inherited: Mapping[str, Any] = parent
    for col in INHERITED_COLUMNS:
        if inherited.get(col) is not None:
            fields[col] = inherited[col]
    fields.update({k: v for k, v in routing.items() if v is not None})
    if end_reason is not None:
        await sessions.end_session(conn, parent_id, end_reason)
    if new_id:
        cid = new_id
        await sessions.insert_session(conn, {**fields, "id": cid})
    else:
        cid = await sessions.insert_new_session(conn, fields, parent["source"] == "cli")
    parent_title = parent.get("title")
    if title is not None:
        await sessions.set_title(conn, cid, title)
    elif parent_title and kind in (ChildKind.COMPRESSION, ChildKind.BRANCH):
        await sessions.set_title(
            conn, cid, await sessions.next_title_in_lineage(conn, parent_title)
        )
    if copy_messages:
        history = await messages.get_messages(conn, parent_id)
        await messages.append_messages(conn, cid, messages.rows_for_copy(history))
    if seeds:
        await messages.append_messages(conn, cid, seeds)
    return cid


async def conversation(
    conn: AsyncConnection, session_id: str, include_ancestors: bool, last: int | None
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if include_ancestors:
        for anc in reversed(await ancestors(conn, session_id)):
            out.extend(await messages.conversation(conn, anc["id"]))
    out.extend(await messages.conversation(conn, session_id, last))
    return out


class LineageOps(Dispatch):
    """PgStore's lineage: ancestors, descendants, children, the compression tip, forks."""

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
        return await self._read(compression_tip, session_id)

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
