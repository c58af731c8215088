"""The Hermes facade's listings and search.

One part of `state.hermes.compat.SessionDB` (Hermes Agent's method names and semantics over
switchboard's store); every part runs its operations through `Facade` (direct.py).
"""

from __future__ import annotations

from ..records import SessionRow
from ..rows import Row
from . import hermes_listing, hermes_search
from .direct import Facade


class ListingPart(Facade):
    """The Hermes facade's listings and search."""

    def list_sessions_rich(
        self,
        source: str | None = None,
        exclude_sources: list[str] | None = None,
        cwd_prefix: str | None = None,
        limit: int = 20,
        offset: int = 0,
        include_children: bool = False,
        min_message_count: int | None = None,
        project_compression_tips: bool = True,
        order_by_last_active: bool = False,
        include_archived: bool = False,
        archived_only: bool = False,
        id_query: str | None = None,
        search_query: str | None = None,
        compact_rows: bool = False,
    ) -> list[Row]:
        q = hermes_listing.RichQuery(
            source=source,
            exclude_sources=tuple(exclude_sources or ()),
            cwd_prefix=cwd_prefix,
            limit=limit,
            offset=offset,
            include_children=include_children,
            min_message_count=min_message_count,
            project_compression_tips=project_compression_tips,
            order_by_last_active=order_by_last_active,
            include_archived=include_archived,
            archived_only=archived_only,
            id_query=id_query,
            search_query=search_query,
            compact_rows=compact_rows,
        )
        return self._r(hermes_listing.list_rich, q)

    def search_sessions_by_id(
        self, query: str, limit: int = 20, include_archived: bool = True
    ) -> list[Row]:
        """Sessions whose id (or lineage root id) contains `query`: exact, then prefix,
        then substring matches."""
        rows = self.list_sessions_rich(
            limit=max(limit, 1) * 4,
            order_by_last_active=True,
            include_archived=include_archived,
            id_query=query,
        )
        needle = query.lower()

        def rank(row: Row) -> int:
            ids = [str(row["id"]).lower(), str(row.get("_lineage_root_id") or "").lower()]
            if needle in ids:
                return 0
            return 1 if any(i.startswith(needle) for i in ids if i) else 2

        return sorted(rows, key=rank)[:limit]

    def search_sessions(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        """Hermes Agent's name for listing sessions by start time (all of them, children
        included), optionally of one source."""
        return self._run(self._db.sessions_by_start(source, limit, offset))

    def search_messages(
        self,
        query: str,
        source_filter: list[str] | None = None,
        exclude_sources: list[str] | None = None,
        role_filter: list[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        sort: str | None = None,
        include_inactive: bool = False,
    ) -> list[Row]:
        """Hits with `context` (previous, hit, next message); a query that cannot be run
        finds nothing."""
        if self._r(lambda c: c.execute("SELECT 1 FROM sb_pending LIMIT 1").fetchone()):
            self._w(lambda c: None)  # every write first indexes rows other programs wrote
        return self._r(
            hermes_search.search_messages,
            query,
            source_filter or (),
            exclude_sources or (),
            role_filter or (),
            limit,
            offset,
            sort,
            include_inactive,
        )
