"""Full-text search in Hermes Agent's shape, for `state.hermes.compat`: a bad query finds nothing
instead of raising, long queries are cut, tool names and arguments match by default, and
each hit carries its neighbours in the session as `context`."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..content import content_text, decode_content
from ..errors import QueryError
from ..records import SearchHit
from ..rows import Row
from ..sqlite import search

MAX_QUERY_CHARS = 2048
CONTEXT_CHARS = 200


def _context_text(stored: Any) -> str:
    value = decode_content(stored)
    if value is None or isinstance(value, str):
        return (value or "")[:CONTEXT_CHARS]
    return (content_text(stored) or "[multimodal content]")[:CONTEXT_CHARS]


def _neighbours(
    conn: sqlite3.Connection, hits: Sequence[SearchHit]
) -> dict[int, tuple[str | None, list[dict[str, Any]]]]:
    """For each hit: its tool name, and the previous message, the hit and the next one of
    the same session, in one statement for the page. Neighbours are by id, switchboard's
    conversation order (an index lookup each)."""
    if not hits:
        return {}
    values = ", ".join("(?, ?)" for _ in hits)
    rows = conn.execute(
        f"WITH hits(hid, sid) AS (VALUES {values}) "
        "SELECT hid, 0, p.role, p.content, NULL FROM hits JOIN messages p ON p.id = "
        "(SELECT MAX(id) FROM messages WHERE session_id = sid AND id < hid) "
        "UNION ALL SELECT hid, 1, p.role, p.content, p.tool_name FROM hits "
        "JOIN messages p ON p.id = hid "
        "UNION ALL SELECT hid, 2, p.role, p.content, NULL FROM hits JOIN messages p ON p.id = "
        "(SELECT MIN(id) FROM messages WHERE session_id = sid AND id > hid)",
        [x for h in hits for x in (h["id"], h["session_id"])],
    ).fetchall()
    found: dict[int, list[tuple[int, str, Any, str | None]]] = {}
    for hid, place, role, content, tool in rows:
        found.setdefault(hid, []).append((place, role, content, tool))
    out: dict[int, tuple[str | None, list[dict[str, Any]]]] = {}
    for hid, near in found.items():
        near.sort(key=lambda n: n[0])
        tool = next((n[3] for n in near if n[0] == 1), None)
        out[hid] = (tool, [{"role": n[1], "content": _context_text(n[2])} for n in near])
    return out


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
        hits = search.search(conn, req)
    except (QueryError, sqlite3.OperationalError):
        return []
    out = []
    near = _neighbours(conn, hits)
    for h in hits:
        tool, context = near.get(h["id"], (None, []))
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
