"""Export and import as JSONL records on PostgreSQL (the rules of state/sqlite/transfer.py):
pages of sessions with their messages, oldest first; imported sessions keep their ids,
taken titles are renamed, dangling parents become roots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from psycopg import AsyncConnection

from ..errors import TitleTaken
from ..records import (
    DERIVED_SESSION_COLUMNS,
    FORMAT_VERSION,
    ExportRecord,
    ImportReport,
    SessionRow,
)
from ..rows import to_json_text
from ..transfer import Transfer
from . import db, messages, sessions
from .dispatch import Dispatch

# --- export / import ---------------------------------------------------------------------


async def export_page(
    conn: AsyncConnection,
    after: tuple[float, str] | None,
    limit: int,
    source: str | None,
    session_ids: list[str] | None,
) -> list[ExportRecord]:
    sql = "SELECT * FROM sessions WHERE TRUE"
    params: list[object] = []
    if after is not None:
        sql += " AND (started_at, id) > (%s, %s)"
        params += [after[0], after[1]]
    if source:
        sql += " AND source = %s"
        params.append(source)
    if session_ids:
        sql += " AND id = ANY(%s)"
        params.append(session_ids)
    found = await db.rows(conn, sql + " ORDER BY started_at, id LIMIT %s", (*params, limit))
    out: list[ExportRecord] = []
    for s in found:
        msgs = await messages.get_messages(conn, s["id"])
        for m in msgs:
            m.pop("session_id", None)
        session = cast(SessionRow, {k: v for k, v in s.items() if k not in DERIVED_SESSION_COLUMNS})
        out.append({"format": FORMAT_VERSION, "session": session, "messages": msgs})
    return out


async def _free_title(conn: AsyncConnection, title: str, session_id: str) -> str:
    owner = await sessions.title_owner(conn, title)
    if owner is None or owner == session_id:
        return title
    n = 1
    while True:
        candidate = f"{title} (imported)" if n == 1 else f"{title} (imported {n})"
        candidate = candidate[-100:] if len(candidate) > 100 else candidate
        if await sessions.title_owner(conn, candidate) is None:
            return candidate
        n += 1


async def _columns(conn: AsyncConnection, table: str) -> set[str]:
    found = await db.tuples(
        conn,
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND table_schema = current_schema()",
        (table,),
    )
    return {r[0] for r in found}


async def import_records(
    conn: AsyncConnection, records: list[Mapping[str, Any]], report: ImportReport
) -> None:
    session_cols = await _columns(conn, "sessions")
    message_cols = set(messages.MESSAGE_FIELDS)
    for rec in records:
        sess = rec.get("session")
        if not isinstance(sess, Mapping) or not isinstance(sess.get("id"), str):
            report.errors.append("a line without a session id was skipped")
            continue
        sid = sess["id"]
        if await db.value(conn, "SELECT 1 FROM sessions WHERE id = %s", (sid,)):
            report.skipped_existing += 1
            continue
        if not sess.get("source") or sess.get("started_at") is None:
            report.errors.append(f"{sid}: missing source or started_at; skipped")
            continue
        fields = {
            k: (to_json_text(v) if isinstance(v, (dict, list)) else v)
            for k, v in sess.items()
            if k in session_cols
            and k not in DERIVED_SESSION_COLUMNS
            and k != "title"
            and k not in ("message_count", "tool_call_count", "preview")
        }
        await sessions.insert_session(conn, fields)
        title = sess.get("title")
        if isinstance(title, str) and title.strip():
            free = await _free_title(conn, title, sid)
            try:
                await sessions.set_title(conn, sid, free)
            except TitleTaken:
                report.errors.append(f"{sid}: title {title!r} could not be kept")
            if free != title:
                report.renamed_titles.append((title, free))
        batch = []
        for msg in rec.get("messages") or []:
            if not isinstance(msg, Mapping) or "role" not in msg:
                continue
            row = {k: v for k, v in msg.items() if k in message_cols}
            row.setdefault("timestamp", sess["started_at"])
            batch.append(row)  # append_messages encodes structured content
        if batch:
            await messages.append_messages(conn, sid, batch)
        report.messages += len(batch)
        await db.run(
            conn,
            "UPDATE sessions SET preview = %s, last_active = %s WHERE id = %s",
            (sess.get("preview"), sess.get("last_active") or sess["started_at"], sid),
        )
        report.imported += 1


async def orphan_dangling(conn: AsyncConnection, ids: list[str]) -> int:
    return await db.run(
        conn,
        "UPDATE sessions c SET parent_session_id = NULL WHERE c.id = ANY(%s) "
        "AND c.parent_session_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM sessions p WHERE p.id = c.parent_session_id)",
        (ids,),
    )


class TransferOps(Transfer, Dispatch):
    """PgStore's export and import (state/transfer.py's paging and batching) over the SQL
    above."""

    async def _export_page(
        self,
        after: tuple[float, str] | None,
        limit: int,
        source: str | None,
        session_ids: list[str] | None,
    ) -> list[ExportRecord]:
        return await self._read(export_page, after, limit, source, session_ids)

    async def _import_batch(self, records: list[Mapping[str, Any]], report: ImportReport) -> None:
        await self._write(import_records, records, report)

    async def _orphan_dangling(self, ids: list[str]) -> int:
        return await self._write(orphan_dangling, ids)
