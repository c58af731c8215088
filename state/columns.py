"""The `sessions` and `messages` columns both schemas hold: Hermes Agent's baseline, its
0.19 additions and switchboard's own, with their SQLite types (state/pg/schema.py
translates them); which session columns a caller may set and how a new session's are
built; switchboard's `state_meta` keys and the size of a prune's transactions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

META_VERSION_KEY = "switchboard.schema_version"
PRUNE_CHUNK = 200  # sessions per transaction, so a large prune never stalls other writers
AUTO_PRUNE_KEY = "switchboard.auto_prune.last_run"  # state_meta: when auto-prune last ran

SESSION_COLUMNS: dict[str, str] = {
    # Baseline (Hermes Agent's documented sessions table).
    "id": "TEXT PRIMARY KEY",
    "source": "TEXT NOT NULL",
    "user_id": "TEXT",
    "model": "TEXT",
    "model_config": "TEXT",
    "system_prompt": "TEXT",
    "parent_session_id": "TEXT REFERENCES sessions(id)",
    "started_at": "REAL NOT NULL",
    "ended_at": "REAL",
    "end_reason": "TEXT",
    "message_count": "INTEGER DEFAULT 0",
    "tool_call_count": "INTEGER DEFAULT 0",
    "input_tokens": "INTEGER DEFAULT 0",
    "output_tokens": "INTEGER DEFAULT 0",
    "cache_read_tokens": "INTEGER DEFAULT 0",
    "cache_write_tokens": "INTEGER DEFAULT 0",
    "reasoning_tokens": "INTEGER DEFAULT 0",
    "billing_provider": "TEXT",
    "billing_base_url": "TEXT",
    "billing_mode": "TEXT",
    "estimated_cost_usd": "REAL",
    "actual_cost_usd": "REAL",
    "cost_status": "TEXT",
    "cost_source": "TEXT",
    "pricing_version": "TEXT",
    "title": "TEXT",
    # Routing and lifecycle (names shared with Hermes Agent where it has them).
    "session_key": "TEXT",
    "chat_id": "TEXT",
    "chat_type": "TEXT",
    "thread_id": "TEXT",
    "origin_json": "TEXT",
    "handoff_state": "TEXT",
    "handoff_platform": "TEXT",
    "handoff_error": "TEXT",
    "archived": "INTEGER DEFAULT 0",
    # switchboard additions.
    "child_kind": "TEXT",
    "last_active": "REAL",
    "preview": "TEXT",
    "title_key": "TEXT",
    "handoff_updated_at": "REAL",
    # Hermes Agent 0.19 columns (schema 10): workspace, gateway peer, usage, compression,
    # rewind state. switchboard fills those it has a use for; the rest keep Hermes's data.
    "display_name": "TEXT",
    "expiry_finalized": "INTEGER DEFAULT 0",
    "cwd": "TEXT",
    "git_branch": "TEXT",
    "git_repo_root": "TEXT",
    "api_call_count": "INTEGER DEFAULT 0",
    "compression_failure_cooldown_until": "REAL",
    "compression_failure_error": "TEXT",
    "compression_fallback_streak": "INTEGER NOT NULL DEFAULT 0",
    "profile_name": "TEXT",
    "rewind_count": "INTEGER NOT NULL DEFAULT 0",
}

MESSAGE_COLUMNS: dict[str, str] = {
    "id": "INTEGER PRIMARY KEY AUTOINCREMENT",
    "session_id": "TEXT NOT NULL REFERENCES sessions(id)",
    "role": "TEXT NOT NULL",
    "content": "TEXT",
    "tool_call_id": "TEXT",
    "tool_calls": "TEXT",
    "tool_name": "TEXT",
    "timestamp": "REAL NOT NULL",
    "token_count": "INTEGER",
    "finish_reason": "TEXT",
    "reasoning": "TEXT",
    "reasoning_details": "TEXT",
    "codex_reasoning_items": "TEXT",
    "platform_message_id": "TEXT",
    # switchboard addition: 1 on rows switchboard wrote (state.hermes.foreign); NULL from others.
    "sb_written": "INTEGER",
    # Hermes Agent 0.19 columns (schema 10).
    "effect_disposition": "TEXT",
    "reasoning_content": "TEXT",
    "codex_message_items": "TEXT",
    "observed": "INTEGER DEFAULT 0",
    "active": "INTEGER NOT NULL DEFAULT 1",
    "compacted": "INTEGER NOT NULL DEFAULT 0",
    "api_content": "TEXT",
}


# Columns a caller may set at creation or later through update_fields.
ROUTING_FIELDS = (
    "source",
    "session_key",
    "chat_id",
    "chat_type",
    "thread_id",
    "origin_json",
    "handoff_state",
    "handoff_platform",
    "handoff_error",
    "handoff_updated_at",
    "archived",
    "model",
    "model_config",
    "billing_provider",
    "billing_base_url",
    "billing_mode",
    "cost_status",
    "cost_source",
    "pricing_version",
)
TOKEN_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def session_fields(
    sid: str,
    source: str,
    model: str | None,
    model_config: Any,
    system_prompt: str | None,
    user_id: str | None,
    parent: str | None,
    child_kind: str | None,
    title: str | None,
    started_at: float | None,
    routing: Mapping[str, Any],
) -> dict[str, Any]:
    """The columns of a new session from create_session's arguments (a pure function both
    stores use); unknown routing fields are a TypeError."""
    bad = [k for k in routing if k not in ROUTING_FIELDS]
    if bad:
        raise TypeError(f"unknown session field(s): {', '.join(bad)}")
    fields: dict[str, Any] = {"id": sid, "source": source}
    for key, value in (
        ("model", model),
        ("model_config", model_config),
        ("system_prompt", system_prompt),
        ("user_id", user_id),
        ("parent_session_id", parent),
        ("child_kind", child_kind),
        ("title", title),
        ("started_at", started_at),
    ):
        if value is not None:
            fields[key] = value
    fields.update({k: v for k, v in routing.items() if v is not None})
    return fields
