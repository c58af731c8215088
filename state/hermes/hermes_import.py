"""Bring a Hermes Agent state.db into switchboard's: sessions (every column both schemas
have: tokens, costs, model, routing, lineage), their messages in order, titles, per-model
usage. Sessions already present are skipped, so a second run changes nothing.

Session keys are the gateway's business: it reads Hermes's keyed rows and routing entries
(`read_routing`), maps them, and passes the result in as `Routing`; here the imported rows
get their new keys, and each key keeps exactly one live session (the one Hermes routed
to; a switchboard session already live on that key wins), so the daemon's index, rebuilt
from state.db, agrees with Hermes's.

Runs on the write connection outside a transaction (ATTACH cannot happen inside one), then
does all its writes in one IMMEDIATE transaction; a dry run rolls that transaction back.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TitleTaken
from ..sqlite.sessions import set_title
from ..sqlite.transfer import orphan_dangling
from . import foreign

# Derived in switchboard (recomputed after the copy), or switchboard's own bookkeeping.
_SKIP_SESSION = {"title", "title_key", "title_base", "title_number", "last_active", "preview"}
_SKIP_MESSAGE = {"id", "sb_written"}


_ROUTING_COLUMNS = (
    "id",
    "session_key",
    "source",
    "user_id",
    "chat_id",
    "chat_type",
    "thread_id",
    "origin_json",
    "started_at",
    "ended_at",
)


@dataclass(frozen=True)
class Routing:
    """What the gateway decided. `keys`: Hermes session id -> (switchboard key, the origin
    it was built from, as switchboard writes origins); `live`: switchboard key -> the
    session Hermes routed to on it."""

    keys: Mapping[str, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    live: Mapping[str, str] = field(default_factory=dict)


@dataclass
class HermesImport:
    sessions: int = 0
    skipped: int = 0
    messages: int = 0
    titles: int = 0
    title_conflicts: list[str] = field(default_factory=list)
    usage_rows: int = 0
    keys_mapped: int = 0
    keys_unmapped: int = 0
    keys_bound: list[tuple[str, str]] = field(default_factory=list)  # (key, session id)
    keys_kept: list[str] = field(default_factory=list)  # a switchboard session holds it
    superseded: int = 0  # live Hermes rows ended: another session holds their key
    imported_ids: list[str] = field(default_factory=list)
    dry_run: bool = False


def read_routing(source: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The routing columns of every Hermes session (a column its file lacks reads None)
    and its gateway_routing entries {key: entry JSON} (newest per key over all scopes).
    Opened read-only."""
    conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        have = set(_cols(conn, "main", "sessions"))
        picks = ", ".join(c if c in have else "NULL" for c in _ROUTING_COLUMNS)
        rows = [
            dict(zip(_ROUTING_COLUMNS, r, strict=True))
            for r in conn.execute(f"SELECT {picks} FROM sessions ORDER BY started_at, id")
        ]
        entries: dict[str, str] = {}
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "gateway_routing" in tables:
            for key, entry in conn.execute(
                "SELECT session_key, entry_json FROM gateway_routing ORDER BY updated_at"
            ):
                entries[str(key)] = str(entry)
        return rows, entries
    finally:
        conn.close()


def _cols(conn: sqlite3.Connection, schema: str, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({table})")]


def import_db(
    conn: sqlite3.Connection, source: Path, dry_run: bool, routing: Routing | None = None
) -> HermesImport:
    report = HermesImport(dry_run=dry_run)
    conn.execute("ATTACH DATABASE ? AS hermes", (f"file:{source}?mode=ro",))
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            _copy(conn, report)
            if report.imported_ids:
                _route(conn, report, routing or Routing())
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
    report.imported_ids = new_ids
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


def _route(conn: sqlite3.Connection, report: HermesImport, routing: Routing) -> None:
    """Give the imported rows switchboard's keys, then leave one live session per key."""
    imported = set(report.imported_ids)
    rekey = [(sid, key, origin) for sid, (key, origin) in routing.keys.items() if sid in imported]
    conn.executemany(
        "UPDATE main.sessions SET session_key = ?, origin_json = ?, chat_id = ?, chat_type = ?, "
        "thread_id = ?, user_id = COALESCE(user_id, ?) WHERE id = ?",
        [
            (
                key,
                json.dumps(dict(origin), ensure_ascii=False),
                origin.get("chat_id"),
                origin.get("chat_type"),
                origin.get("thread_id"),
                origin.get("user_id"),
                sid,
            )
            for sid, key, origin in rekey
        ],
    )
    report.keys_mapped = len(rekey)
    # a Hermes key the gateway could not map would never be routed to: drop it (the row's
    # chat columns and origin stay)
    unmapped = [(sid,) for sid in report.imported_ids if sid not in routing.keys]
    report.keys_unmapped = conn.executemany(
        "UPDATE main.sessions SET session_key = NULL WHERE id = ? AND session_key IS NOT NULL",
        unmapped,
    ).rowcount
    now = time.time()
    keys = sorted({key for _, key, _ in rekey})
    for key in keys:
        live = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM main.sessions WHERE session_key = ? AND ended_at IS NULL",
                (key,),
            )
        ]
        theirs = [sid for sid in live if sid in imported]
        if not theirs:
            continue
        keep = routing.live.get(key)
        if any(sid not in imported for sid in live):
            keep = None  # a switchboard session is live on this key: it keeps it
            report.keys_kept.append(key)
        elif keep not in theirs:
            keep = max(theirs, key=lambda sid: _started(conn, sid))
        if keep is not None:
            report.keys_bound.append((key, keep))
        ended = [sid for sid in theirs if sid != keep]
        conn.executemany(
            "UPDATE main.sessions SET ended_at = ?, end_reason = 'session_switch' "
            "WHERE id = ? AND ended_at IS NULL",
            [(now, sid) for sid in ended],
        )
        report.superseded += len(ended)


def _started(conn: sqlite3.Connection, sid: str) -> tuple[float, str]:
    (started,) = conn.execute(
        "SELECT started_at FROM main.sessions WHERE id = ?", (sid,)
    ).fetchone()
    return (float(started or 0), sid)
