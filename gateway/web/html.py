"""Escaping for server-side HTML: every value is escaped unless it is `Safe` markup built
here, so a hostile title or message can only ever show up as text.

Bidi controls (U+202A-U+202E, U+2066-U+2069) and zero-width marks are shown as visible
`[U+202E]` tokens: escaped or not, they would otherwise reorder the text around them.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from urllib.parse import quote, urlencode

from state import MARK_CLOSE, MARK_OPEN

_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


class Safe(str):
    """Markup that is already escaped."""

    __slots__ = ()


def esc(value: object) -> Safe:
    """Escape one value for text or a quoted attribute."""
    if isinstance(value, Safe):
        return value
    text = "" if value is None else str(value)
    text = html.escape(text, quote=True)
    return Safe(_INVISIBLE.sub(lambda m: f"[U+{ord(m.group()):04X}]", text))


def t(template: str, *args: object, **kwargs: object) -> Safe:
    """`template.format` with every argument escaped (the template itself is trusted)."""
    return Safe(
        template.format(*(_arg(a) for a in args), **{k: _arg(v) for k, v in kwargs.items()})
    )


def _arg(value: object) -> object:
    # numbers keep their type so format specs like {:.1f} work; they need no escaping
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return esc(value)


def join(parts: Iterable[object], sep: str = "") -> Safe:
    return Safe(sep.join(esc(p) for p in parts))


def url(path: str, *segments: str, **query: object) -> str:
    """A path with percent-encoded segments and a query (None values dropped)."""
    out = path + "".join("/" + quote(s, safe="") for s in segments)
    params = {k: v for k, v in query.items() if v is not None and v != ""}
    return out + ("?" + urlencode(params) if params else "")


def highlight(snippet: str) -> Safe:
    """A search snippet with its `>>>match<<<` marks as <mark>, each part escaped first."""
    out: list[str] = []
    rest = snippet
    while True:
        start = rest.find(MARK_OPEN)
        end = rest.find(MARK_CLOSE, start + len(MARK_OPEN)) if start >= 0 else -1
        if start < 0 or end < 0:
            out.append(esc(rest))
            return Safe("".join(out))
        out.append(esc(rest[:start]))
        out.append(t("<mark>{}</mark>", rest[start + len(MARK_OPEN) : end]))
        rest = rest[end + len(MARK_CLOSE) :]
