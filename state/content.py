"""Message content on disk: plain text, or structured (multimodal) content in the encoding
Hermes Agent uses, so each program reads the other's rows back as structures.

Structured content (a list of parts or a dict) is stored as text: a NUL character, `json:`,
then the JSON. Plain strings are stored as they are, except one holding a NUL (which the
intakes of state/text.py never let in, but an older row or another program may hold): it is
stored in the same encoding as a JSON string, so no text can pass for a structure, and it
reads back as the same string. Rows that hold no NUL-bearing plain text read as before.
"""

from __future__ import annotations

import json
from typing import Any

SENTINEL = "\x00json:"
# The same prefix as bytes, for SQL (SQLite's text functions stop at a NUL; blob ones do not).
SENTINEL_BLOB_HEX = "006A736F6E3A"


def encode_content(content: Any) -> str | None:
    """What goes into messages.content for a caller's value."""
    if content is None:
        return None
    if isinstance(content, str) and "\x00" not in content:
        return content
    return SENTINEL + json.dumps(content, ensure_ascii=False, separators=(",", ":"))


def decode_content(stored: Any) -> Any:
    """The caller's value back from messages.content (undecodable text stays text)."""
    if isinstance(stored, str) and stored.startswith(SENTINEL):
        try:
            return json.loads(stored[len(SENTINEL) :])
        except ValueError:
            return stored
    return stored


def content_text(stored: Any) -> str | None:
    """The searchable/previewable text of stored content: text parts of structures."""
    value = decode_content(stored)
    if value is None or isinstance(value, str):
        return value
    parts = value if isinstance(value, list) else [value]
    texts = [
        str(p.get("text"))
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("text"), str) and p.get("text")
    ]
    return " ".join(texts) if texts else None


# SQL expression decoding `content` for json_object(): structures as JSON, text as text.
SQL_DECODED_CONTENT = (
    f"CASE WHEN substr(CAST(content AS BLOB), 1, 6) = X'{SENTINEL_BLOB_HEX}' "
    "AND json_valid(CAST(substr(CAST(content AS BLOB), 7) AS TEXT)) "
    "THEN json(CAST(substr(CAST(content AS BLOB), 7) AS TEXT)) ELSE content END"
)
