"""`import_sessions` in Hermes Agent's shape, for `state.hermes.compat`: a batch of exported
sessions (session columns plus `messages`) validated as a whole first, then imported in one
transaction: existing ids skipped, runtime state reset, parents linked only where that
parent exists and no cycle results.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import StateError
from ..sqlite import sessions
from . import hermes_messages

MAX_SESSIONS = 500
MAX_MESSAGES_PER_SESSION = 10_000
MAX_MESSAGES_TOTAL = 50_000
MAX_SESSION_BYTES = 5 * 1024 * 1024
MAX_TOTAL_BYTES = 25 * 1024 * 1024

TEXT_FIELDS = (
    "source",
    "user_id",
    "model",
    "system_prompt",
    "parent_session_id",
    "end_reason",
    "title",
    "session_key",
    "chat_id",
    "chat_type",
    "thread_id",
    "display_name",
    "cwd",
    "git_branch",
    "git_repo_root",
    "billing_provider",
    "billing_base_url",
    "billing_mode",
    "cost_status",
    "cost_source",
    "pricing_version",
    "profile_name",
)
NUMBER_FIELDS = (
    "started_at",
    "ended_at",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "estimated_cost_usd",
    "actual_cost_usd",
    "api_call_count",
    "archived",
)


def _session_error(rec: Any) -> str | None:
    if not isinstance(rec, Mapping):
        return "session must be an object"
    sid = rec.get("id")
    if not isinstance(sid, str) or not sid.strip():
        return "session id is required"
    try:
        size = len(json.dumps(rec, default=str).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError):
        return "session is not serialisable"
    if size > MAX_SESSION_BYTES:
        return "session exceeds the import size limit"
    msgs = rec.get("messages", [])
    if not isinstance(msgs, list):
        return "messages must be a list"
    if len(msgs) > MAX_MESSAGES_PER_SESSION:
        return "messages exceeds the per-session import limit"
    config = rec.get("model_config")
    if isinstance(config, str):
        try:
            if not isinstance(json.loads(config), dict):
                return "model_config must be valid JSON"
        except ValueError:
            return "model_config must be valid JSON"
    elif config is not None and not isinstance(config, dict):
        return "model_config must be valid JSON"
    for name in TEXT_FIELDS:
        if rec.get(name) is not None and not isinstance(rec[name], str):
            return f"{name} must be a string"
    for name in NUMBER_FIELDS:
        value = rec.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{name} must be a number"
    for i, msg in enumerate(msgs):
        role = msg.get("role") if isinstance(msg, Mapping) else None
        if not isinstance(role, str) or not role.strip():
            return f"messages[{i}].role must be a non-empty string"
    return None


def validate(batch: Any) -> list[dict[str, Any]]:
    """Every problem of the batch (empty when it may be imported)."""
    if not isinstance(batch, list):
        return [{"index": 0, "error": "sessions must be a list"}]
    if len(batch) > MAX_SESSIONS:
        return [{"index": MAX_SESSIONS, "error": "too many sessions in one import"}]
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    total_messages = 0
    total_bytes = 0
    for i, rec in enumerate(batch):
        problem = _session_error(rec)
        sid = rec.get("id") if isinstance(rec, Mapping) else None
        if problem is None and sid in seen:
            problem = "duplicate session id in the batch"
        if problem is not None:
            err: dict[str, Any] = {"index": i, "error": problem}
            if isinstance(sid, str) and sid.strip():
                err = {"index": i, "session_id": sid, "error": problem}
            errors.append(err)
            continue
        seen.add(str(sid))  # a valid record's id is a string (_session_error)
        total_messages += len(rec.get("messages") or [])
        total_bytes += len(json.dumps(rec, default=str).encode("utf-8", "surrogatepass"))
    if not errors and total_messages > MAX_MESSAGES_TOTAL:
        errors.append({"index": len(batch) - 1, "error": "too many messages in one import"})
    if not errors and total_bytes > MAX_TOTAL_BYTES:
        errors.append({"index": len(batch) - 1, "error": "import exceeds the total size limit"})
    return errors


# Runtime state that does not travel: handoffs, rewinds, expiry bookkeeping.
_RUNTIME = {
    "handoff_state",
    "handoff_platform",
    "handoff_error",
    "handoff_updated_at",
    "rewind_count",
    "expiry_finalized",
    "messages",
    "title",
    "parent_session_id",
    "title_key",
    "title_base",
    "title_number",
    "last_active",
    "preview",
    "message_count",
    "tool_call_count",
    "_lineage_root_id",
}


def _db_parent(conn: sqlite3.Connection, sid: str) -> str | None:
    row = conn.execute("SELECT parent_session_id FROM sessions WHERE id = ?", (sid,)).fetchone()
    return row[0] if row else None


def import_batch(conn: sqlite3.Connection, batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    cols = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    imported: list[str] = []
    skipped: list[str] = []
    parents: dict[str, str | None] = {}
    for rec in batch:
        sid = str(rec["id"])
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
            skipped.append(sid)
            continue
        fields = {k: v for k, v in rec.items() if k in cols and k not in _RUNTIME}
        fields["id"] = sid
        fields["source"] = rec.get("source") or "import"
        fields.setdefault("started_at", time.time())
        sessions.insert_session(conn, fields)
        if rec.get("title"):
            try:
                sessions.set_title(conn, sid, hermes_messages.scrub(rec["title"]))
            except (StateError, ValueError):
                pass  # a title taken here stays with its holder; the session arrives untitled
        for msg in rec.get("messages") or []:
            item = dict(msg)
            item.pop("id", None)
            item.pop("session_id", None)
            hermes_messages.append(conn, sid, item)
        imported.append(sid)
        parents[sid] = rec.get("parent_session_id") or None
    detached = 0
    for sid in imported:
        parent = parents[sid]
        if parent is None:
            continue
        exists = (
            parent in parents
            or conn.execute("SELECT 1 FROM sessions WHERE id = ?", (parent,)).fetchone() is not None
        )
        cycle = False
        current: str | None = parent
        for _ in range(1000):
            if current is None:
                break
            if current == sid:
                cycle = True
                break
            current = parents[current] if current in parents else _db_parent(conn, current)
        if not exists or cycle:
            parents[sid] = None
            detached += 1
    for sid in imported:
        if parents[sid] is not None:
            conn.execute(
                "UPDATE sessions SET parent_session_id = ? WHERE id = ?", (parents[sid], sid)
            )
    return {
        "ok": True,
        "imported": len(imported),
        "skipped": len(skipped),
        "detached": detached,
        "imported_ids": imported,
        "skipped_ids": skipped,
        "errors": [],
    }
