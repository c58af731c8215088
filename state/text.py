"""The characters a store holds: the one rule every intake applies to text before it
reaches SQLite or PostgreSQL, and the count of what it changed.

U+0000 (NUL) and lone surrogates (U+D800 to U+DFFF without a partner, which a JSON
"\\ud800" escape produces) cannot be stored as they are: PostgreSQL text refuses NUL,
SQLite's text functions stop at one, and neither store encodes a lone surrogate as UTF-8.
The HTTP API refuses such text (400, naming the field); the chat platforms, which cannot
be refused, and `sessions import` replace each such character by U+FFFD and keep the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(text: str) -> str | None:
    """Why `text` cannot be stored as it is (naming its first such character), or None."""
    if text.isascii() and "\x00" not in text:  # most text: two scans in C, no regex
        return None
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    char = found.group()
    what = "U+0000 (NUL)" if char == "\x00" else f"a lone surrogate U+{ord(char):04X}"
    return f"contains {what} at character {found.start()}, which cannot be stored"


def storable(text: str) -> tuple[str, int]:
    """`text` with each NUL and lone surrogate replaced by U+FFFD, and how many were."""
    if (text.isascii() and "\x00" not in text) or _UNSTORABLE.search(text) is None:
        return text, 0
    return _UNSTORABLE.subn(REPLACEMENT, text)


def storable_value(value: Any) -> tuple[Any, int]:
    """`storable` over every string in a JSON-like value (keys too), and the count."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        total = 0
        for k, v in value.items():
            if isinstance(k, str):
                k, n = storable(k)
                total += n
            out[k], n = storable_value(v)
            total += n
        return (out, total) if total else (value, 0)
    if isinstance(value, (list, tuple)):
        items = []
        total = 0
        for v in value:
            v, n = storable_value(v)
            items.append(v)
            total += n
        return (items, total) if total else (value, 0)
    return value, 0
