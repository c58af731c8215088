"""Title rules: cleaning, the case-insensitive comparison key and ` #N` lineage numbers.

Pure functions; the store applies them inside its write transactions so uniqueness is
checked and claimed atomically.
"""

from __future__ import annotations

import re
import unicodedata

from .errors import TitleEmpty, TitleTooLong

MAX_TITLE_LENGTH = 100

# Zero-width and bidi-control characters: invisible, and able to make two titles look
# identical or reorder what a reader sees.
_INVISIBLE = {
    "\u200b",
    "\u200c",
    "\u200d",
    "\u200e",
    "\u200f",
    "\u2060",
    "\u2061",
    "\u2062",
    "\u2063",
    "\u2064",
    "\ufeff",
    "\u180e",
    "\u061c",
    "\u202a",
    "\u202b",
    "\u202c",
    "\u202d",
    "\u202e",
    "\u2066",
    "\u2067",
    "\u2068",
    "\u2069",
}
_WS_RUN = re.compile(r"\s+")
_LINEAGE_SUFFIX = re.compile(r"^(?P<base>.*\S) #(?P<n>[1-9][0-9]{0,8})$")


def _keep(ch: str) -> bool:
    if ch in _INVISIBLE:
        return False
    cat = unicodedata.category(ch)
    if cat == "Cc":  # control characters; whitespace controls become spaces below
        return ch in "\t\n\r\x0b\x0c"
    # Emoji ZWJ sequences need U+200D, but a title is a label, not artwork; the
    # emoji themselves survive.
    return cat != "Cf" or ch == "\ufe0f"


def clean_title(raw: str) -> str:
    """Remove control/invisible characters, collapse whitespace, trim. May return ''."""
    if raw.isascii() and raw.isprintable():  # nothing to remove: just the whitespace rule
        return " ".join(raw.split())
    kept = "".join(ch for ch in raw if _keep(ch))
    return _WS_RUN.sub(" ", kept).strip()


def title_key(title: str) -> str:
    """The comparison key: titles that differ only in case (any script) collide."""
    return unicodedata.normalize("NFC", title).casefold()


def split_lineage(title: str) -> tuple[str, int]:
    """`"my project #3"` -> `("my project", 3)`; a title without ` #N` is number 1."""
    m = _LINEAGE_SUFFIX.match(title)
    if m:
        return m.group("base"), int(m.group("n"))
    return title, 1


def lineage_key(title: str) -> tuple[str, int]:
    """(comparison key of the lineage base, number): what title_base/title_number store."""
    base, number = split_lineage(title)
    return title_key(base), number


def lineage_title(base: str, number: int) -> str:
    return base if number <= 1 else f"{base} #{number}"


def sanitize_title(raw: str) -> str:
    """Clean a title and enforce the length rule; raises TitleEmpty / TitleTooLong."""
    title = clean_title(raw)
    if not title:
        raise TitleEmpty()
    if len(title) > MAX_TITLE_LENGTH:
        raise TitleTooLong(len(title), MAX_TITLE_LENGTH)
    return title
