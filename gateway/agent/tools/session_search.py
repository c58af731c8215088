"""The agent-facing `session_search` tool: discover, scroll and browse past sessions.

It returns JSON and calls no model. Every shape is limited to the sessions the caller may
see (a `SessionFilter` supplied by the gateway's access rules), and bad arguments come back
as `{"success": false, "error": ...}`, never as a traceback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from state import SessionFilter, SessionRow, StateError, Store

log = logging.getLogger("gateway.agent.tools.session_search")

MAX_CONTENT = 500
BOOKEND = 3
HIT_WINDOW = 5
DEFAULT_ROLES = ("user", "assistant")

SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "session_search",
        "description": (
            "Search or read this user's past conversations. With `query`: the best matching "
            "sessions (not the current one), each with its start, end and the messages around "
            "the hit. With `session_id` and `around_message_id`: read more of one session. "
            "With no arguments: the most recent sessions."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": 'words, "phrases", OR, NOT, prefix*'},
                "roles": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["user", "assistant", "tool", "system"]},
                },
                "sort": {"type": "string", "enum": ["relevance", "newest", "oldest"]},
                "limit": {"type": "integer", "minimum": 1, "maximum": 10},
                "session_id": {"type": "string"},
                "around_message_id": {"type": "integer"},
                "window": {"type": "integer", "minimum": 1, "maximum": 20},
            },
        },
    },
}


@dataclass(frozen=True)
class Caller:
    """Who is asking: what they may see, and the session they are in now."""

    scope: SessionFilter = field(default_factory=lambda: SessionFilter(include_children=True))
    current_session_id: str | None = None


def _cut(text: str | None, limit: int = MAX_CONTENT) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + f"… [truncated {len(text) - limit} chars]"


def _msg(row: Mapping[str, Any], hit_id: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row["id"],
        "role": row["role"],
        "content": _cut(row.get("content")),
    }
    if hit_id is not None and row["id"] == hit_id:
        out["hit"] = True
    return out


def _error(message: str) -> str:
    return json.dumps({"success": False, "error": message}, ensure_ascii=False)


async def _visible(db: Store, caller: Caller, session_id: str) -> SessionRow | None:
    """The session row if the caller's scope covers it."""
    row = await db.get_session(session_id)
    if row is None:
        return None
    s = caller.scope
    wanted_sources = [*s.sources, *([s.source] if s.source else [])]
    if wanted_sources and row["source"] not in wanted_sources:
        return None
    if row["source"] in s.exclude_sources:
        return None
    for col in ("user_id", "chat_id", "thread_id"):
        want = getattr(s, col)
        if want is not None and row.get(col) != want:
            return None
    return row


async def _lineage_root(db: Store, session_id: str, cache: dict[str, str]) -> str:
    if session_id not in cache:
        ancestors = await db.get_ancestors(session_id)
        cache[session_id] = ancestors[-1]["id"] if ancestors else session_id
    return cache[session_id]


async def session_search(db: Store, caller: Caller, args: dict[str, Any] | None = None) -> str:
    """Dispatch on the arguments' shape; always returns a JSON string."""
    args = dict(args or {})
    try:
        if args.get("query") not in (None, ""):
            return await _discover(db, caller, args)
        if args.get("session_id") is not None or args.get("around_message_id") is not None:
            return await _scroll(db, caller, args)
        unknown = set(args) - {"limit"}
        if unknown:
            return _error(f"unexpected argument(s): {', '.join(sorted(unknown))}")
        return await _browse(db, caller, args)
    except StateError as exc:
        return _error(str(exc))
    except (TypeError, ValueError) as exc:
        return _error(f"bad arguments: {exc}")
    except Exception:  # the model must never see a traceback
        log.exception("session_search failed")
        return _error("search failed; try again later")


def _int_arg(args: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer from {lo} to {hi}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be from {lo} to {hi}")
    return value


async def _discover(db: Store, caller: Caller, args: dict[str, Any]) -> str:
    query = args["query"]
    if not isinstance(query, str):
        raise ValueError("query must be a string")
    limit = _int_arg(args, "limit", 3, 1, 10)
    roles = args.get("roles") or list(DEFAULT_ROLES)
    if not isinstance(roles, list) or not all(
        r in ("user", "assistant", "tool", "system") for r in roles
    ):
        raise ValueError("roles must be a list of user, assistant, tool, system")
    sort = args.get("sort", "relevance")
    roots: dict[str, str] = {}
    excluded_root = None
    if caller.current_session_id:
        excluded_root = await _lineage_root(db, caller.current_session_id, roots)
    results: list[dict[str, Any]] = []
    seen_roots: set[str] = set()
    offset = 0
    page = max(20, limit * 5)
    while len(results) < limit:
        hits = await db.search_messages(
            query, roles=roles, scope=caller.scope, sort=sort, limit=page, offset=offset
        )
        for hit in hits:
            root = await _lineage_root(db, hit["session_id"], roots)
            if root == excluded_root or root in seen_roots:
                continue
            seen_roots.add(root)
            results.append(await _describe_hit(db, hit))
            if len(results) >= limit:
                break
        if len(hits) < page or offset >= 10 * page:
            break
        offset += page
    return json.dumps(
        {"success": True, "query": query, "count": len(results), "results": results},
        ensure_ascii=False,
    )


async def _describe_hit(db: Store, hit: Mapping[str, Any]) -> dict[str, Any]:
    sid, mid = hit["session_id"], hit["id"]
    window = await db.get_messages_around(sid, mid, HIT_WINDOW)
    convo = [
        m for m in await db.get_messages(sid, limit=BOOKEND * 4) if m["role"] in DEFAULT_ROLES
    ][:BOOKEND]
    tail = [m for m in await db.get_messages(sid, last=BOOKEND * 4) if m["role"] in DEFAULT_ROLES][
        -BOOKEND:
    ]
    first_id = window[0]["id"] if window else mid
    last_id = window[-1]["id"] if window else mid
    before, after = await db.count_messages_outside(sid, first_id, last_id)
    return {
        "session_id": sid,
        "title": hit.get("title"),
        "when": hit.get("started_at"),
        "source": hit.get("source"),
        "snippet": hit.get("snippet"),
        "match_message_id": mid,
        "bookend_start": [_msg(m) for m in convo],
        "messages": [_msg(m, mid) for m in window],
        "bookend_end": [_msg(m) for m in tail],
        "messages_before": before,
        "messages_after": after,
    }


async def _scroll(db: Store, caller: Caller, args: dict[str, Any]) -> str:
    sid = args.get("session_id")
    mid = args.get("around_message_id")
    if not isinstance(sid, str) or not sid:
        raise ValueError("session_id is required with around_message_id")
    if isinstance(mid, bool) or not isinstance(mid, int):
        raise ValueError("around_message_id must be an integer")
    window = _int_arg(args, "window", 10, 1, 20)
    row = await _visible(db, caller, await db.resolve_session_id(sid))
    if row is None:
        return _error("session not found")
    msgs = await db.get_messages_around(row["id"], mid, window)
    if not msgs:
        return _error("no such message in that session")
    return json.dumps(
        {
            "success": True,
            "session_id": row["id"],
            "title": row.get("title"),
            "messages": [_msg(m, mid) for m in msgs],
            # The edge ids repeat in the next page, so paging forward or back never skips.
            "first_message_id": msgs[0]["id"],
            "last_message_id": msgs[-1]["id"],
        },
        ensure_ascii=False,
    )


async def _browse(db: Store, caller: Caller, args: dict[str, Any]) -> str:
    limit = _int_arg(args, "limit", 10, 1, 50)
    scope = caller.scope
    listing = SessionFilter(
        source=scope.source,
        sources=scope.sources,
        exclude_sources=scope.exclude_sources,
        user_id=scope.user_id,
        chat_id=scope.chat_id,
        thread_id=scope.thread_id,
    )
    rows = await db.list_filtered(listing, limit=limit)
    return json.dumps(
        {
            "success": True,
            "sessions": [
                {
                    "session_id": r["id"],
                    "title": r.get("title"),
                    "preview": r.get("preview"),
                    "source": r["source"],
                    "last_active": r.get("last_active"),
                    "current": r["id"] == caller.current_session_id,
                }
                for r in rows
            ],
        },
        ensure_ascii=False,
    )
