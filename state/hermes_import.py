"""Bring a Hermes Agent state.db into switchboard's: sessions (every column both schemas
have: tokens, costs, model, routing, lineage), their messages in order, titles, per-model
usage. Sessions already present are skipped, so a second run changes nothing.

Runs on the write connection outside a transaction (ATTACH cannot happen inside one), then
does all its writes in one IMMEDIATE transaction; a dry run rolls that transaction back.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from . import foreign
from .errors import TitleTaken
from .sessions import set_title
from .transfer import orphan_dangling

# Derived in switchboard (recomputed after the copy), or switchboard's own bookkeeping.
_SKIP_SESSION = {"title", "title_key", "title_base", "title_number", "last_active", "preview"}
_SKIP_MESSAGE = {"id", "sb_written"}


@dataclass
class HermesImport:
    sessions: int = 0
    skipped: int = 0
    messages: int = 0
    titles: int = 0
    title_conflicts: list[str] = field(default_factory=list)
    usage_rows: int = 0
    dry_run: bool = False


def _cols(conn: sqlite3.Connection, schema: str, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({table})")]


def import_db(conn: sqlite3.Connection, source: Path, dry_run: bool) -> HermesImport:
    report = HermesImport(dry_run=dry_run)
    conn.execute("ATTACH DATABASE ? AS hermes", (f"file:{source}?mode=ro",))
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            _copy(conn, report)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("ROLLBACK" if dry_run else "COMMIT")
    finally:
        conn.execute("DETACH DATABASE hermes")
    return report


def _copy(conn: sqlite3.Connection, report: HermesImport) -> None:
    new_ids = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM hermes.sessions WHERE id NOT IN (SELECT id FROM main.sessions) "
            "ORDER BY started_at, id"
        )
    ]
    (total,) = conn.execute("SELECT COUNT(*) FROM hermes.sessions").fetchone()
    report.skipped = total - len(new_ids)
    if not new_ids:
        return
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS sb_import_ids (id TEXT PRIMARY KEY)")
    conn.execute("DELETE FROM temp.sb_import_ids")
    conn.executemany("INSERT INTO temp.sb_import_ids VALUES (?)", [(i,) for i in new_ids])
    mine = set(_cols(conn, "main", "sessions"))
    cols = [c for c in _cols(conn, "hermes", "sessions") if c in mine and c not in _SKIP_SESSION]
    names = ", ".join(cols)
    conn.execute(
        f"INSERT INTO main.sessions ({names}) SELECT {names} FROM hermes.sessions "
        "WHERE id IN (SELECT id FROM temp.sb_import_ids)"
    )
    report.sessions = len(new_ids)
    mine_m = set(_cols(conn, "main", "messages"))
    mcols = [c for c in _cols(conn, "hermes", "messages") if c in mine_m and c not in _SKIP_MESSAGE]
    mnames = ", ".join(mcols)
    report.messages = conn.execute(
        f"INSERT INTO main.messages ({mnames}) SELECT {mnames} FROM hermes.messages "
        "WHERE session_id IN (SELECT id FROM temp.sb_import_ids) ORDER BY id"
    ).rowcount
    conn.execute(
        "UPDATE main.sessions SET last_active = COALESCE((SELECT MAX(m.timestamp) FROM "
        "main.messages m WHERE m.session_id = sessions.id), started_at) "
        "WHERE id IN (SELECT id FROM temp.sb_import_ids)"
    )
    for sid, title in conn.execute(
        "SELECT id, title FROM hermes.sessions WHERE title IS NOT NULL "
        "AND id IN (SELECT id FROM temp.sb_import_ids) ORDER BY started_at"
    ).fetchall():
        try:
            set_title(conn, sid, title)
            report.titles += 1
        except (TitleTaken, ValueError):
            report.title_conflicts.append(f"{sid}: {title}")
    if "session_model_usage" in {
        r[0] for r in conn.execute("SELECT name FROM hermes.sqlite_master WHERE type = 'table'")
    }:
        ucols = ", ".join(_cols(conn, "hermes", "session_model_usage"))
        report.usage_rows = conn.execute(
            f"INSERT OR IGNORE INTO main.session_model_usage ({ucols}) SELECT {ucols} "
            "FROM hermes.session_model_usage WHERE session_id IN (SELECT id FROM temp.sb_import_ids)"
        ).rowcount
    orphan_dangling(conn, new_ids)
    foreign.absorb(conn, limit=None)  # previews and the CJK/tool side index of the new rows
