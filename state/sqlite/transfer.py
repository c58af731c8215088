"""Export and import as JSONL: one line per session, holding its row and its messages.

Export streams a page of sessions at a time; import is idempotent by session id, keeps
lineage (a parent may appear later in the file) and titles (a title already used by
another session gets an ` (imported)` suffix rather than failing the line).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any, cast

from ..content import content_text, encode_content
from ..errors import TitleTaken
from ..message_rows import decode_message
from ..records import (
    DERIVED_SESSION_COLUMNS,
    FORMAT_VERSION,
    ExportRecord,
    ImportReport,
    SessionRow,
)
from ..rows import row_dict, to_json_text
from ..textindex import aux_row
from ..transfer import Transfer
from . import activity
from .dispatch import Dispatch
from .sessions import set_title, title_owner


def export_page(
    conn: sqlite3.Connection,
    after: tuple[float, str] | None,
    limit: int,
    source: str | None,
    session_ids: list[str] | None,
) -> list[ExportRecord]:
    """The next page of sessions (keyset-paginated by started_at, id) with their messages."""
    sql = "SELECT * FROM sessions WHERE 1"
    params: list[object] = []
    if after is not None:
        sql += " AND (started_at > ? OR (started_at = ? AND id > ?))"
        params += [after[0], after[0], after[1]]
    if source:
        sql += " AND source = ?"
        params.append(source)
    if session_ids:
        sql += f" AND id IN ({', '.join('?' for _ in session_ids)})"
        params += session_ids
    cur = conn.execute(sql + " ORDER BY started_at, id LIMIT ?", (*params, limit))
    sessions = [row_dict(cur, r) for r in cur.fetchall()]
    out: list[ExportRecord] = []
    for s in sessions:
        mcur = conn.execute("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (s["id"],))
        msgs = [decode_message(row_dict(mcur, r)) for r in mcur.fetchall()]
        for m in msgs:
            m.pop("session_id", None)
        out.append(
            {
                "format": FORMAT_VERSION,
                "session": cast(
                    SessionRow, {k: v for k, v in s.items() if k not in DERIVED_SESSION_COLUMNS}
                ),
                "messages": msgs,
            }
        )
    return out


def _free_title(conn: sqlite3.Connection, title: str, session_id: str) -> str:
    owner = title_owner(conn, title)
    if owner is None or owner == session_id:
        return title
    n = 1
    while True:
        candidate = f"{title} (imported)" if n == 1 else f"{title} (imported {n})"
        candidate = candidate[-100:] if len(candidate) > 100 else candidate
        if title_owner(conn, candidate) is None:
            return candidate
        n += 1


def import_records(
    conn: sqlite3.Connection, records: list[Mapping[str, Any]], report: ImportReport
) -> None:
    session_cols = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    message_cols = {r[1] for r in conn.execute("PRAGMA table_info(messages)")} - {
        "id",
        "session_id",
    }
    for rec in records:
        sess = rec.get("session")
        if not isinstance(sess, Mapping) or not isinstance(sess.get("id"), str):
            report.errors.append("a line without a session id was skipped")
            continue
        sid = sess["id"]
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
            report.skipped_existing += 1
            continue
        if not sess.get("source") or sess.get("started_at") is None:
            report.errors.append(f"{sid}: missing source or started_at; skipped")
            continue
        fields = {
            k: (to_json_text(v) if isinstance(v, (dict, list)) else v)
            for k, v in sess.items()
            if k in session_cols and k not in DERIVED_SESSION_COLUMNS and k != "title"
        }
        names = ", ".join(fields)
        conn.execute(
            f"INSERT INTO sessions ({names}) VALUES ({', '.join('?' for _ in fields)})",
            tuple(fields.values()),
        )
        title = sess.get("title")
        if isinstance(title, str) and title.strip():
            free = _free_title(conn, title, sid)
            try:
                set_title(conn, sid, free)
            except TitleTaken:
                report.errors.append(f"{sid}: title {title!r} could not be kept")
            if free != title:
                report.renamed_titles.append((title, free))
        messages = rec.get("messages") or []
        tool_calls = 0
        counted: list[tuple[str, int, float, str, str | None]] = []
        for msg in messages:
            if not isinstance(msg, Mapping) or "role" not in msg:
                continue
            row: dict[str, Any] = {
                k: (
                    to_json_text(v)
                    if k in ("tool_calls", "reasoning_details", "codex_reasoning_items")
                    else v
                )
                for k, v in msg.items()
                if k in message_cols
            }
            row.setdefault("timestamp", sess["started_at"])
            if "content" in row:
                row["content"] = encode_content(row["content"])
            row["sb_written"] = 1
            cur = conn.execute(
                f"INSERT INTO messages (session_id, {', '.join(row)}) "
                f"VALUES (?, {', '.join('?' for _ in row)})",
                (sid, *row.values()),
            )
            counted.append(
                (
                    sess["source"],
                    int(cur.lastrowid or 0),
                    float(row["timestamp"]),
                    str(row["role"]),
                    row.get("tool_name"),
                )
            )
            aux = aux_row(
                content_text(row.get("content")), row.get("tool_name"), row.get("tool_calls")
            )
            if aux is not None:
                conn.execute(
                    "INSERT INTO messages_aux(message_id, seg_text, tool_text) VALUES (?, ?, ?)",
                    (cur.lastrowid, aux[0], aux[1]),
                )
            if row.get("tool_calls"):
                parsed = (
                    json.loads(row["tool_calls"]) if isinstance(row["tool_calls"], str) else None
                )
                tool_calls += len(parsed) if isinstance(parsed, list) else 1
            report.messages += 1
        activity.add(conn, activity.tally(counted))
        conn.execute(
            "UPDATE sessions SET message_count = (SELECT COUNT(*) FROM messages WHERE session_id = ?), "
            "tool_call_count = ? WHERE id = ?",
            (sid, tool_calls, sid),
        )
        report.imported += 1


def orphan_dangling(conn: sqlite3.Connection, ids: list[str]) -> int:
    """Clear parent links (of the given sessions) that point at sessions that do not exist."""
    if not ids:
        return 0
    marks = ", ".join("?" for _ in ids)
    return conn.execute(
        f"UPDATE sessions SET parent_session_id = NULL WHERE id IN ({marks}) "
        "AND parent_session_id IS NOT NULL "
        "AND parent_session_id NOT IN (SELECT id FROM sessions)",
        ids,
    ).rowcount


class TransferOps(Transfer, Dispatch):
    """SessionDB's export and import (state/transfer.py's paging and batching) over the SQL
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
