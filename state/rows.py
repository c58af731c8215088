"""Row helpers shared by the read and write paths: JSON columns, previews, escaping, and
running a script inside an open transaction."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from .text import storable

Row = dict[str, Any]

JSON_MESSAGE_COLUMNS = ("tool_calls", "reasoning_details", "codex_reasoning_items")
PREVIEW_LENGTH = 60


def to_json_text(value: object) -> str | None:
    """Store structured values as JSON text; strings are assumed to be JSON already."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def from_json_text(value: str | None) -> object:
    if value is None:
        return None
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def make_preview(content: str | None) -> str | None:
    """A session's preview: its first message on one line, shortened (a NUL, which only a
    row from elsewhere can hold, shows as U+FFFD: the preview column is plain text)."""
    if not content:
        return None
    flat = " ".join(storable(content)[0].split())
    return flat[:PREVIEW_LENGTH] if flat else None


def like_escape(text: str) -> str:
    """Escape LIKE wildcards; use with `ESCAPE '\\'`."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def row_dict(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Row:
    return {d[0]: v for d, v in zip(cursor.description, row, strict=True)}


def exec_script(conn: sqlite3.Connection, script: str) -> None:
    """Run statements one by one: executescript() would commit the open transaction."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            conn.execute(pending)
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement: {pending.strip()[:60]}")


_ASCII_JSON = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode


def payload_of(values: object) -> str:
    """The payload (any JSON value) as ASCII JSON: text a platform delivered with a lone
    surrogate is kept (escaped), so taking a message never fails on its text (storing it
    may, later). One encoder for every call: json.dumps with options builds one each time."""
    return _ASCII_JSON(values)
