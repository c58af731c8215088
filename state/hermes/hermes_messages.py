"""Message operations in Hermes Agent's shapes, for `state.hermes.compat`: the extra fields
(reasoning content, codex items, observed, effect disposition, api content), active rows,
pagination, the conversation projection with ancestor replay dedupe, replace.

SQL functions over a connection; the facade runs them in the store's transactions.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..content import decode_content
from ..rows import Row, row_dict, to_json_text
from ..sqlite import messages

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_LINEAGE_HOPS = 100

# Fields append_messages stores itself; the rest go in with an UPDATE in the same transaction.
_EXTRA_FIELDS = (
    "reasoning_content",
    "codex_message_items",
    "observed",
    "effect_disposition",
    "api_content",
)


def scrub(value: Any) -> Any:
    """Replace lone UTF-16 surrogates (unencodable as UTF-8) by U+FFFD; others untouched."""
    if isinstance(value, str) and _LONE_SURROGATE.search(value):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    return value


def _prepare(msg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fields append_messages takes, extra Hermes fields) from a Hermes message dict."""
    base: dict[str, Any] = {"role": msg.get("role"), "content": scrub(msg.get("content"))}
    for name in ("tool_call_id", "tool_name", "token_count", "finish_reason", "reasoning"):
        if msg.get(name) is not None:
            base[name] = scrub(msg[name])
    for name in ("tool_calls", "reasoning_details", "codex_reasoning_items"):
        if msg.get(name) is not None:
            base[name] = scrub(msg[name])
    if msg.get("timestamp") is not None:
        base["timestamp"] = float(msg["timestamp"])
    pmid = msg.get("platform_message_id", msg.get("message_id"))
    if pmid is not None:
        base["platform_message_id"] = str(pmid)
    extra: dict[str, Any] = {}
    if msg.get("reasoning_content") is not None:
        extra["reasoning_content"] = scrub(msg["reasoning_content"])
    if msg.get("codex_message_items") is not None:
        extra["codex_message_items"] = to_json_text(scrub(msg["codex_message_items"]))
    if msg.get("observed"):
        extra["observed"] = 1
    if msg.get("effect_disposition"):
        extra["effect_disposition"] = str(msg["effect_disposition"])
    if msg.get("api_content") is not None:
        extra["api_content"] = scrub(msg["api_content"])
    return base, extra


def _set_extra(conn: sqlite3.Connection, message_id: int, extra: Mapping[str, Any]) -> None:
    if extra:
        cols = ", ".join(f"{k} = ?" for k in extra)
        conn.execute(f"UPDATE messages SET {cols} WHERE id = ?", (*extra.values(), message_id))


def append(conn: sqlite3.Connection, session_id: str, msg: Mapping[str, Any]) -> int:
    base, extra = _prepare(msg)
    (mid,) = messages.append_messages(conn, session_id, [base])
    _set_extra(conn, mid, extra)
    return mid


def read(
    conn: sqlite3.Connection,
    session_id: str,
    include_inactive: bool,
    limit: int | None,
    offset: int,
) -> list[Row]:
    sql = "SELECT * FROM messages WHERE session_id = ?"
    if not include_inactive:
        sql += " AND active = 1"
    sql += " ORDER BY id"
    params: list[Any] = [session_id]
    if limit is not None or offset:
        sql += " LIMIT ? OFFSET ?"
        params += [-1 if limit is None else limit, offset]
    cur = conn.execute(sql, params)
    out = []
    for raw in cur.fetchall():
        row = row_dict(cur, raw)
        row.pop("sb_written", None)
        row["content"] = decode_content(row.get("content"))
        if row.get("tool_calls"):
            try:
                row["tool_calls"] = json.loads(row["tool_calls"])
            except (TypeError, ValueError):
                row["tool_calls"] = []
        out.append(row)
    return out


def lineage(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """Session ids from the root of the parent chain to `session_id` (cycles cut)."""
    chain = [session_id]
    seen = {session_id}
    current = session_id
    for _ in range(MAX_LINEAGE_HOPS):
        row = conn.execute(
            "SELECT parent_session_id FROM sessions WHERE id = ?", (current,)
        ).fetchone()
        parent = row[0] if row else None
        if not parent or parent in seen:
            break
        chain.append(parent)
        seen.add(parent)
        current = parent
    chain.reverse()
    return chain


_CONVERSATION_COLUMNS = (
    "session_id, role, content, tool_call_id, tool_calls, tool_name, effect_disposition, "
    "finish_reason, reasoning, reasoning_content, reasoning_details, codex_reasoning_items, "
    "codex_message_items, platform_message_id, observed, timestamp, api_content"
)


def conversation_rows(
    conn: sqlite3.Connection, session_ids: Sequence[str], include_inactive: bool = False
) -> list[Row]:
    marks = ", ".join("?" for _ in session_ids)
    active = "" if include_inactive else " AND active = 1"
    cur = conn.execute(
        f"SELECT {_CONVERSATION_COLUMNS} FROM messages WHERE session_id IN ({marks}){active} "
        "ORDER BY id",
        tuple(session_ids),
    )
    return [row_dict(cur, r) for r in cur.fetchall()]


def _json_or_none(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def project(row: Row) -> dict[str, Any]:
    """One stored row as a chat message: optional keys only when they carry something;
    reasoning fields only on assistant rows."""
    msg: dict[str, Any] = {"role": row["role"], "content": decode_content(row["content"])}
    if isinstance(msg["content"], str) and row["role"] in ("user", "assistant"):
        msg["content"] = msg["content"].strip()
    if row["api_content"]:
        msg["api_content"] = row["api_content"]
    if row["timestamp"]:
        msg["timestamp"] = row["timestamp"]
    for key in ("tool_call_id", "tool_name", "effect_disposition"):
        if row[key]:
            msg[key] = row[key]
    if row["tool_calls"]:
        calls = _json_or_none(row["tool_calls"])
        msg["tool_calls"] = calls if calls is not None else []
    if row["platform_message_id"]:
        msg["message_id"] = row["platform_message_id"]
    if row["observed"]:
        msg["observed"] = True
    if row["role"] == "assistant":
        if row["finish_reason"]:
            msg["finish_reason"] = row["finish_reason"]
        if row["reasoning"]:
            msg["reasoning"] = row["reasoning"]
        if row["reasoning_content"] is not None:
            msg["reasoning_content"] = row["reasoning_content"]
        for key in ("reasoning_details", "codex_reasoning_items", "codex_message_items"):
            if row[key]:
                msg[key] = _json_or_none(row[key])
    return msg


def _replayed_user(history: list[dict[str, Any]], msg: dict[str, Any]) -> bool:
    """A user message whose text was already sent with no assistant reply since: a resume
    prompt an ancestor replayed into its continuation."""
    if msg["role"] != "user":
        return False
    for earlier in reversed(history):
        if earlier["role"] == "assistant" and (earlier.get("content") or earlier.get("tool_calls")):
            return False
        if earlier["role"] == "user" and earlier.get("content") == msg.get("content"):
            return True
    return False


def repair(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A sequence a chat API accepts: consecutive user (or assistant, without tool calls)
    turns merged, tool results without a preceding matching call dropped, a trailing
    assistant tool call without results dropped."""
    out: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    for msg in history:
        role = msg["role"]
        if role == "tool":
            if msg.get("tool_call_id") in open_calls:
                out.append(msg)
            continue
        if role == "assistant" and msg.get("tool_calls"):
            open_calls = {
                str(c.get("id")) for c in msg["tool_calls"] if isinstance(c, dict) and c.get("id")
            }
        prev = out[-1] if out else None
        mergeable = (
            prev is not None
            and prev["role"] == role
            and role in ("user", "assistant")
            and not prev.get("tool_calls")
            and not msg.get("tool_calls")
            and isinstance(prev.get("content"), str)
            and isinstance(msg.get("content"), str)
        )
        if mergeable:
            assert prev is not None
            prev = {**prev, "content": f"{prev['content']}\n\n{msg['content']}".strip()}
            out[-1] = prev
            continue
        out.append(msg)
    while out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
        out.pop()
    return out


def to_conversation(
    rows: Iterable[Row], *, dedupe_replays: bool, repair_alternation: bool
) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for row in rows:
        msg = project(row)
        if dedupe_replays and _replayed_user(history, msg):
            continue
        history.append(msg)
    return repair(history) if repair_alternation else history


def replace(
    conn: sqlite3.Connection,
    session_id: str,
    new: Sequence[Mapping[str, Any]],
    active_only: bool,
) -> None:
    """Swap the session's (active) rows for `new` in one transaction; counters follow."""
    where = " AND active = 1" if active_only else ""
    conn.execute(f"DELETE FROM messages WHERE session_id = ?{where}", (session_id,))
    conn.execute(
        "UPDATE sessions SET message_count = 0, tool_call_count = 0, preview = NULL WHERE id = ?",
        (session_id,),
    )
    now = time.time()
    step = 1e-6
    for i, msg in enumerate(new):
        item = dict(msg)
        if msg.get("role") != "assistant":
            for key in (
                "reasoning",
                "reasoning_content",
                "reasoning_details",
                "codex_reasoning_items",
                "codex_message_items",
            ):
                item.pop(key, None)
        if item.get("timestamp") is None:
            item["timestamp"] = now + i * step
        append(conn, session_id, item)
    if active_only:
        conn.execute(
            "UPDATE sessions SET message_count = (SELECT COUNT(*) FROM messages "
            "WHERE session_id = ?1) WHERE id = ?1",
            (session_id,),
        )


def set_latest_user_api_content(
    conn: sqlite3.Connection, session_id: str, content: Any, api_content: str
) -> int:
    row = conn.execute(
        "SELECT id, content FROM messages WHERE session_id = ? AND role = 'user' AND active = 1 "
        "ORDER BY id DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    if row is None or decode_content(row[1]) != scrub(content):
        return 0
    conn.execute("UPDATE messages SET api_content = ? WHERE id = ?", (scrub(api_content), row[0]))
    return 1
