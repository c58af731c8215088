"""Full-text search in Hermes Agent's shape, for `state.hermes.compat`: a bad query finds nothing
instead of raising, long queries are cut, tool names and arguments match by default, and
each hit carries its neighbours in the session as `context`."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, cast

from ..content import content_text, decode_content
from ..errors import QueryError
from ..rows import Row
from ..sqlite import search

MAX_QUERY_CHARS = 2048
CONTEXT_CHARS = 200


def _context_text(stored: Any) -> str:
    value = decode_content(stored)
    if value is None or isinstance(value, str):
        return (value or "")[:CONTEXT_CHARS]
    return (content_text(stored) or "[multimodal content]")[:CONTEXT_CHARS]


def search_messages(
    conn: sqlite3.Connection,
    query: str,
    sources: Sequence[str],
    exclude_sources: Sequence[str],
    roles: Sequence[str],
    limit: int,
    offset: int,
    sort: str | None,
    include_inactive: bool = False,
) -> list[Row]:
    """Hermes's search: rewound rows (active=0, not compacted) only with include_inactive;
    rows compacted away stay findable."""
    text = (query or "")[:MAX_QUERY_CHARS]
    if not text.strip():
        return []
    req = search.SearchRequest(
        query=text,
        sources=tuple(sources),
        exclude_sources=tuple(exclude_sources),
        roles=tuple(roles),
        sort=sort or "relevance",
        limit=limit,
        offset=offset,
        include_tools=True,
        include_inactive=include_inactive,
    )
    try:
        hits = search.search(conn, req, neighbours=True)
    except (QueryError, sqlite3.OperationalError):
        return []
    out = []
    for h in hits:
        tool, near = cast(dict[str, Any], h).pop("_near", (None, []))
        context = [{"role": role, "content": _context_text(content)} for role, content in near]
        out.append(
            {
                "id": h["id"],
                "session_id": h["session_id"],
                "role": h["role"],
                "snippet": h.get("snippet"),
                "timestamp": h["timestamp"],
                "tool_name": tool,
                "source": h.get("source"),
                "model": h.get("model"),
                "session_started": h.get("started_at"),
                "context": context,
            }
        )
    return out
