"""What a message row holds on its way into a store and back: the fields a caller may set,
validation and JSON columns (`row_values`), tool-call counts, and decoding a stored row.
Pure functions that both stores (state/sqlite/messages.py, state/pg/messages.py) use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from .content import decode_content, encode_content
from .records import MessageRow
from .rows import JSON_MESSAGE_COLUMNS, Row, from_json_text, to_json_text

MESSAGE_FIELDS = (
    "role",
    "content",
    "tool_call_id",
    "tool_calls",
    "tool_name",
    "timestamp",
    "token_count",
    "finish_reason",
    "reasoning",
    "reasoning_details",
    "codex_reasoning_items",
    "platform_message_id",
)
ROLES = ("system", "user", "assistant", "tool")
# `last_active` has a resolution of one second: an append moves it only when the message is
# at least that much newer. Four listing indexes end in last_active, and SQLite rewrites an
# index (PostgreSQL loses its HOT update) whenever an UPDATE sets one of its columns, even to
# the same value; so the move matches (and costs) once a second per busy session instead of
# on every message. Listings show minutes; prune works in days.
LAST_ACTIVE_RESOLUTION_S = 1.0


def tool_call_count(tool_calls: object) -> int:
    if tool_calls is None:
        return 0
    value = from_json_text(tool_calls) if isinstance(tool_calls, str) else tool_calls
    return len(value) if isinstance(value, list) else 1


# Fields stored as they come (text, or a number the column takes); a list, a mapping, bytes
# or a boolean there is refused by name rather than left to each store and path to fail, or
# to store, in its own way (the JSON columns, tool_calls and the reasoning details, take them).
_SCALAR = (str, int, float)


def _scalar(msg: Mapping[str, Any], name: str) -> Any:
    value = msg.get(name)
    if value is None or type(value) is str:
        return value
    if isinstance(value, _SCALAR) and not isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be text or a number, not {type(value).__name__}")


def row_values(session_id: str, msg: Mapping[str, Any], now: float) -> tuple[Any, ...]:
    role = msg.get("role")
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    content = encode_content(msg.get("content"))  # multimodal parts: Hermes's encoding
    return (
        session_id,
        role,
        content,
        _scalar(msg, "tool_call_id"),
        to_json_text(msg.get("tool_calls")),
        _scalar(msg, "tool_name"),
        float(msg.get("timestamp") or now),
        _scalar(msg, "token_count"),
        _scalar(msg, "finish_reason"),
        _scalar(msg, "reasoning"),
        to_json_text(msg.get("reasoning_details")),
        to_json_text(msg.get("codex_reasoning_items")),
        _scalar(msg, "platform_message_id"),
    )


def decode_message(row: Row) -> MessageRow:
    for name in JSON_MESSAGE_COLUMNS:
        if name in row:
            row[name] = from_json_text(row[name])
    if "content" in row:
        row["content"] = decode_content(row["content"])
    row.pop("sb_written", None)
    return cast(MessageRow, row)
