"""The Hermes facade's export (of a session or its compression lineage) and import, delete, prune, archive, meta, search index upkeep and VACUUM.

One part of `state.hermes.compat.SessionDB` (Hermes Agent's method names and semantics over
switchboard's store); every part runs its operations through `Facade` (direct.py).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from ..errors import SessionNotFound
from ..rows import Row
from ..sqlite import archive, maintenance, schema
from . import hermes_sessions, hermes_transfer
from .direct import Facade

# The state_meta key of the last automatic prune (Hermes Agent's own name for it).
AUTO_PRUNE_META_KEY = "last_auto_prune"


class AdminPart(Facade):
    """The Hermes facade's export, delete, prune, archive, meta, search index upkeep and VACUUM."""

    def export_session(self, session_id: str) -> Row | None:
        try:
            rec = self._run(self._db.export_session(session_id))
        except SessionNotFound:
            return None
        return {**rec["session"], "messages": rec["messages"]}

    def export_all(self, source: str | None = None) -> list[Row]:
        async def collect() -> list[Row]:
            return [
                {**r["session"], "messages": r["messages"]}
                async for r in self._db.export_all(source)
            ]

        return self._run(collect())

    def delete_session(self, session_id: str, sessions_dir: Any = None) -> bool:
        return bool(self._w(archive.delete_many, [session_id]))

    def delete_sessions(self, session_ids: list[Any], sessions_dir: Any = None) -> int:
        """Delete the listed sessions (any state) in one transaction; the real count."""
        wanted = {i for i in session_ids if isinstance(i, str)}
        return sum(1 for sid in self._w(archive.delete_many, session_ids) if sid in wanted)

    def count_empty_sessions(self) -> int:
        return len(self._r(archive.empty_ids))

    def delete_empty_sessions(self, sessions_dir: Any = None) -> int:
        return len(self._w(lambda c: archive.delete_many(c, archive.empty_ids(c))))

    def delete_session_if_empty(self, session_id: str, sessions_dir: Any = None) -> bool:
        def write(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT title IS NULL AND COALESCE(message_count, 0) = 0 "
                "AND NOT EXISTS (SELECT 1 FROM messages WHERE session_id = ?1) "
                "AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_session_id = ?1) "
                "FROM sessions WHERE id = ?1",
                (session_id,),
            ).fetchone()
            return bool(row and row[0]) and bool(archive.delete_many(conn, [session_id]))

        return self._w(write)

    def list_prune_candidates(
        self, older_than_days: float | None = None, source: str | None = None, **filters: Any
    ) -> list[Row]:
        return self._r(archive.select, older_than_days, source, filters, time.time())

    def prune_sessions(
        self,
        older_than_days: float | None = 90,
        source: str | None = None,
        sessions_dir: Any = None,
        **filters: Any,
    ) -> int:
        """Delete ended sessions started before the cut-off (and matching the filters);
        their children are orphaned."""

        def write(conn: sqlite3.Connection) -> int:
            rows = archive.select(conn, older_than_days, source, filters, time.time())
            ids = [r["id"] for r in rows]
            conn.execute(
                f"DELETE FROM session_model_usage WHERE session_id IN ({', '.join('?' for _ in ids)})",
                ids,
            )
            return maintenance.delete_sessions(conn, ids)

        return self._w(write)

    def archive_sessions(
        self, older_than_days: float | None = None, source: str | None = None, **filters: Any
    ) -> int:
        filters.setdefault("archived", False)

        def write(conn: sqlite3.Connection) -> int:
            rows = archive.select(conn, older_than_days, source, filters, time.time())
            return archive.archive_many(conn, [r["id"] for r in rows])

        return self._w(write)

    def set_session_archived(self, session_id: str, archived: bool) -> bool:
        return self._w(hermes_sessions.set_archived, session_id, archived)

    def get_meta(self, key: str) -> str | None:
        return self._run(self._db.get_meta(key))

    def set_meta(self, key: str, value: str) -> None:
        self._run(self._db.set_meta(key, value))

    def optimize_fts(self) -> int:
        """FTS5 'optimize' on each search index of the file; how many there were."""

        def write(conn: sqlite3.Connection) -> int:
            names = [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%USING fts5%' "
                    "AND name IN (?, 'messages_aux_fts')",
                    (schema.FTS_TABLE,),
                )
            ]
            for name in names:
                conn.execute(f"INSERT INTO {name}({name}) VALUES ('optimize')")
            return len(names)

        return self._w(write)

    def rebuild_fts(self) -> int:
        self._run(self._db.rebuild_search_index())
        return 2

    def vacuum(self) -> int:
        count = self.optimize_fts()
        self._run(self._db.vacuum())
        return count

    def maybe_auto_prune_and_vacuum(
        self,
        retention_days: int = 90,
        min_interval_hours: int = 24,
        vacuum: bool = True,
        sessions_dir: Any = None,
    ) -> dict[str, Any]:
        """Prune (by start time) at most once per interval, VACUUM after a prune that
        removed something; never raises."""
        result: dict[str, Any] = {"skipped": False, "pruned": 0, "vacuumed": False}
        try:
            last = self.get_meta(AUTO_PRUNE_META_KEY)
            try:
                last_ts = float(last) if last is not None else None
            except ValueError:
                last_ts = None
            now = time.time()
            if last_ts is not None and now - last_ts < min_interval_hours * 3600:
                result["skipped"] = True
                return result
            result["pruned"] = self.prune_sessions(older_than_days=retention_days)
            if result["pruned"] and vacuum:
                self.vacuum()
                result["vacuumed"] = True
            self.set_meta(AUTO_PRUNE_META_KEY, str(now))
        except Exception as exc:  # noqa: BLE001 - maintenance must never break a start-up
            result["error"] = str(exc)
        return result

    def get_compression_lineage(self, session_id: str) -> list[str]:
        return self._r(hermes_sessions.compression_lineage, session_id)

    def export_session_lineage(self, session_id: str) -> Row | None:
        """The tip's export plus every segment of its compression chain, in order."""
        ids = self.get_compression_lineage(session_id)
        if not ids:
            return None
        segments = [s for s in (self.export_session(i) for i in ids) if s is not None]
        tip = dict(segments[-1])
        tip["segments"] = segments
        tip["lineage_session_ids"] = ids
        tip["messages"] = [m for seg in segments for m in seg["messages"]]
        tip["message_count"] = len(tip["messages"])
        return tip

    def import_sessions(self, sessions: list[dict[str, Any]]) -> dict[str, Any]:
        """Import exported sessions; a batch with any invalid entry imports nothing."""
        errors = hermes_transfer.validate(sessions)
        if errors:
            return {"ok": False, "imported": 0, "skipped": 0, "detached": 0, "errors": errors}
        return self._w(hermes_transfer.import_batch, sessions)
