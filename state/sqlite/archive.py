"""Bulk housekeeping: delete many sessions at once, empty sessions, archive, and selecting
ended sessions by filters (start window, title/model/branch text, end reason, owner, cwd,
size, tokens, cost, tool calls, archived state) for pruning or archiving.

Deleting a session also deletes its usage rows and the subagent sessions it delegated to
(model_config `_delegate_from`, recursively); other children are orphaned, never deleted.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..hermes import hermes_import, hermes_sessions
from ..hermes.hermes_sessions import compression_family, cwd_prefix_clause
from ..rows import Row
from . import maintenance
from .dispatch import Dispatch

FILTERS = frozenset(
    {
        "started_before",
        "started_after",
        "title_like",
        "model_like",
        "branch_like",
        "end_reason",
        "user_id",
        "chat_id",
        "chat_type",
        "provider",
        "cwd_prefix",
        "min_messages",
        "max_messages",
        "min_tokens",
        "max_tokens",
        "min_cost",
        "max_cost",
        "min_tool_calls",
        "max_tool_calls",
        "archived",
    }
)

_DELEGATE_CHILDREN = (
    "SELECT id FROM sessions WHERE json_valid(model_config) "
    "AND json_extract(model_config, '$._delegate_from') = ?"
)


def _with_delegates(conn: sqlite3.Connection, ids: Iterable[str]) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    frontier = list(ids)
    while frontier:
        sid = frontier.pop()
        if sid in seen:
            continue
        seen.add(sid)
        out.append(sid)
        frontier.extend(r[0] for r in conn.execute(_DELEGATE_CHILDREN, (sid,)))
    return out


def delete_many(conn: sqlite3.Connection, ids: Iterable[object]) -> list[str]:
    """Delete the listed sessions that exist (any state), with their delegate subagents.
    Non-strings, blanks and repeats are ignored. Returns the ids deleted."""
    wanted = list(dict.fromkeys(i for i in ids if isinstance(i, str) and i.strip()))
    if not wanted:
        return []
    marks = ", ".join("?" for _ in wanted)
    found = [r[0] for r in conn.execute(f"SELECT id FROM sessions WHERE id IN ({marks})", wanted)]
    doomed = _with_delegates(conn, found)
    if not doomed:
        return []
    for start in range(0, len(doomed), 500):
        chunk = doomed[start : start + 500]
        cmarks = ", ".join("?" for _ in chunk)
        conn.execute(f"DELETE FROM session_model_usage WHERE session_id IN ({cmarks})", chunk)
        maintenance.delete_sessions(conn, chunk)
    return doomed


def empty_ids(conn: sqlite3.Connection) -> list[str]:
    """Ended, unarchived sessions without a message."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT id FROM sessions WHERE COALESCE(message_count, 0) = 0 "
            "AND ended_at IS NOT NULL AND COALESCE(archived, 0) = 0 "
            "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = sessions.id)"
        )
    ]


def select(
    conn: sqlite3.Connection,
    older_than_days: float | None,
    source: str | None,
    filters: Mapping[str, Any],
    now: float,
) -> list[Row]:
    """Ended sessions matching every filter (AND), oldest start first."""
    unknown = sorted(set(filters) - FILTERS)
    if unknown:
        raise TypeError(f"unknown prune filter(s): {', '.join(unknown)}")
    sql = [
        "SELECT id, source, title, model, started_at, ended_at, message_count, "
        "COALESCE(archived, 0) AS archived FROM sessions WHERE ended_at IS NOT NULL"
    ]
    params: list[Any] = []

    def add(clause: str, *values: Any) -> None:
        sql.append(" AND " + clause)
        params.extend(values)

    f = dict(filters)
    if older_than_days is not None:
        add("started_at < ?", now - float(older_than_days) * 86400)
    if source:
        add("source = ?", source)
    if f.get("started_before") is not None:
        add("started_at < ?", float(f["started_before"]))
    if f.get("started_after") is not None:
        add("started_at >= ?", float(f["started_after"]))
    for key, col in (
        ("title_like", "title"),
        ("model_like", "model"),
        ("branch_like", "git_branch"),
    ):
        if f.get(key):
            add(f"lower({col}) LIKE ? ESCAPE '\\'", "%" + _esc(str(f[key]).lower()) + "%")
    for key in ("end_reason", "user_id", "chat_id", "chat_type"):
        if f.get(key) is not None:
            add(f"{key} = ?", f[key])
    if f.get("provider"):
        add("lower(billing_provider) = ?", str(f["provider"]).lower())
    if f.get("cwd_prefix"):
        clause, values = cwd_prefix_clause(f["cwd_prefix"])
        add(clause.removeprefix(" AND "), *values)
    ranges = (
        ("messages", "COALESCE(message_count, 0)"),
        ("tokens", "COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0)"),
        ("cost", "COALESCE(actual_cost_usd, estimated_cost_usd, 0)"),
        ("tool_calls", "COALESCE(tool_call_count, 0)"),
    )
    for name, expr in ranges:
        if f.get(f"min_{name}") is not None:
            add(f"{expr} >= ?", f[f"min_{name}"])
        if f.get(f"max_{name}") is not None:
            add(f"{expr} <= ?", f[f"max_{name}"])
    if f.get("archived") is True:
        add("COALESCE(archived, 0) = 1")
    elif f.get("archived") is False:
        add("COALESCE(archived, 0) = 0")
    cur = conn.execute("".join(sql) + " ORDER BY started_at, id", params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def archive_many(conn: sqlite3.Connection, ids: Iterable[str]) -> int:
    """Archive each session lineage-wide (compression ancestors and continuations)."""
    count = 0
    done: set[str] = set()
    for sid in ids:
        if sid in done:
            continue
        family = compression_family(conn, sid)
        done.update(family)
        marks = ", ".join("?" for _ in family)
        conn.execute(f"UPDATE sessions SET archived = 1 WHERE id IN ({marks})", family)
        count += 1
    return count


class ArchiveOps(Dispatch):
    """SessionDB's archive, bulk delete, workspace columns and the Hermes import."""

    async def set_session_archived(self, session_id: str, archived: bool = True) -> bool:
        """Archive (or restore) a session with its compression ancestors and continuations."""
        return bool(await self._write(hermes_sessions.set_archived, session_id, archived))

    async def delete_sessions(self, session_ids: list[str]) -> list[str]:
        """Delete many sessions in one transaction (with their delegate subagents)."""
        return list(await self._write(delete_many, session_ids))

    async def update_session_cwd(
        self,
        session_id: str,
        cwd: str,
        git_branch: str | None = None,
        git_repo_root: str | None = None,
    ) -> None:
        await self._write(hermes_sessions.update_cwd, session_id, cwd, git_branch, git_repo_root)

    async def import_hermes(
        self,
        source: str | os.PathLike[str],
        *,
        dry_run: bool = False,
        routing: hermes_import.Routing | None = None,
    ) -> Any:
        """Copy a Hermes Agent state.db's sessions, messages, titles and usage in (once);
        `routing` gives the imported rows switchboard's session keys (state/hermes/hermes_import.py)."""
        return await self._writer.exclusive(hermes_import.import_db, Path(source), dry_run, routing)
