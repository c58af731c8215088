"""Export and import as JSONL records, the part both stores share: sessions streamed a page
at a time (oldest first, keyset on (started_at, id)), the JSONL lines, imports committed in
batches of records with the report kept across them, and the dangling parents of the
imported sessions made roots afterwards (a parent may come in a later batch).

Each backend's `TransferOps` (state/sqlite/transfer.py, state/pg/transfer.py) supplies the
page read and the two writes in its own SQL.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import IO, Any

from .errors import SessionNotFound
from .records import ExportRecord, ImportReport

ORPHAN_CHUNK = 500  # imported ids per statement that makes dangling parents roots


class Transfer:
    """export_session, export_all, write_jsonl and import_records over a backend's three
    steps (`_export_page`, `_import_batch`, `_orphan_dangling`)."""

    async def _export_page(
        self,
        after: tuple[float, str] | None,
        limit: int,
        source: str | None,
        session_ids: list[str] | None,
    ) -> list[ExportRecord]:
        raise NotImplementedError

    async def _import_batch(self, records: list[Mapping[str, Any]], report: ImportReport) -> None:
        raise NotImplementedError

    async def _orphan_dangling(self, ids: list[str]) -> int:
        raise NotImplementedError

    async def export_session(self, session_id: str) -> ExportRecord:
        page = await self._export_page(None, 1, None, [session_id])
        if not page:
            raise SessionNotFound(session_id)
        return page[0]

    async def export_all(
        self,
        source: str | None = None,
        *,
        session_ids: list[str] | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[ExportRecord]:
        """Stream sessions (each with its messages), oldest first, a page at a time."""
        after: tuple[float, str] | None = None
        while True:
            page = await self._export_page(after, page_size, source, session_ids)
            for rec in page:
                yield rec
            if len(page) < page_size:
                return
            last = page[-1]["session"]
            after = (last["started_at"], last["id"])

    async def write_jsonl(self, fh: IO[str], **kwargs: Any) -> int:
        """Export to a text file object as JSONL; returns the number of sessions."""
        n = 0
        async for rec in self.export_all(**kwargs):
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
        return n

    async def import_records(
        self, records: Iterable[Mapping[str, Any]], *, batch: int = 100
    ) -> ImportReport:
        """Import exported records; sessions that already exist are skipped."""
        report = ImportReport()
        pending: list[Mapping[str, Any]] = []
        ids: list[str] = []

        async def flush() -> None:
            if pending:
                chunk = list(pending)
                pending.clear()
                await self._import_batch(chunk, report)

        for rec in records:
            rec = report.storable(rec)
            pending.append(rec)
            sess = rec.get("session") if isinstance(rec, Mapping) else None
            if isinstance(sess, Mapping) and isinstance(sess.get("id"), str):
                ids.append(sess["id"])
            if len(pending) >= batch:
                await flush()
        await flush()
        for i in range(0, len(ids), ORPHAN_CHUNK):
            await self._orphan_dangling(ids[i : i + ORPHAN_CHUNK])
        return report
