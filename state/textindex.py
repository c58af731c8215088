"""How text is prepared for the search indexes.

The main index (`sb_messages_fts`, unicode61) sees message content as it is. unicode61 keeps a
run of CJK characters glued to Latin letters as one token and drops emoji entirely, so
messages that contain such characters get a second, segmented copy in `messages_aux`:
every CJK character becomes its own token and every symbol (emoji) a stable word, so a
phrase query over those tokens finds any substring. English-only messages never pay for it.
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_right
from collections.abc import Callable

_CJK_RANGES = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x2E80, 0x2FDF),  # CJK radicals
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x312F),  # Bopomofo
    (0x3130, 0x318F),  # Hangul compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xA960, 0xA97F),  # Hangul Jamo extended A
    (0xAC00, 0xD7AF),  # Hangul syllables
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # halfwidth Katakana
    (0x20000, 0x3134F),  # CJK extensions B..G
)
SYMBOL_PREFIX = "sym"
# each range's first code point and the one after its last: odd positions are inside
_CJK_BOUNDS = [edge for lo, hi in _CJK_RANGES for edge in (lo, hi + 1)]
TRANSLATION_CACHE = 20_000  # characters a PerChar table remembers


def is_cjk(ch: str) -> bool:
    """A CJK letter or digit: one token of its own in the segmented index. The ranges also
    hold symbols (the radicals, U+2E80-2FDF, are `So`: indexed as symbols) and punctuation
    and marks (`・`, `゛`, `゠`): separators, as unicode61 treats them everywhere. Taken as
    tokens, they were dropped from the index yet kept in the query, so a search for one
    found nothing (Hypothesis found `⺀`)."""
    cp = ord(ch)
    return (
        cp >= 0x1100
        and bisect_right(_CJK_BOUNDS, cp) % 2 == 1
        and unicodedata.category(ch)[0] in "LN"
    )


class PerChar(dict[int, str]):
    """A `str.translate` table that works out each character's replacement the first time
    it meets it: the search ranks hundreds of CJK texts per query, and a Python function
    per character was most of its time."""

    def __init__(self, rule: Callable[[str], str]) -> None:
        super().__init__()
        self._rule = rule

    def __missing__(self, cp: int) -> str:
        out = self._rule(chr(cp))
        if len(self) < TRANSLATION_CACHE:
            self[cp] = out
        return out


def is_symbol(ch: str) -> bool:
    """Emoji and other pictographs: dropped by unicode61, indexed as words here."""
    return ord(ch) > 0x7F and unicodedata.category(ch) == "So"


def needs_aux(text: str | None) -> bool:
    """True when unicode61 alone would miss part of this text."""
    if not text or text.isascii():
        return False
    return any(is_cjk(ch) or is_symbol(ch) for ch in text)


def symbol_token(ch: str) -> str:
    return f"{SYMBOL_PREFIX}{ord(ch):x}"


def _segmented(ch: str) -> str:
    if is_cjk(ch):
        return f" {ch} "
    if is_symbol(ch):
        return f" {symbol_token(ch)} "
    if unicodedata.category(ch) == "Cf" or ch == "\ufe0f":
        return " "  # joiners and variation selectors carry no searchable meaning
    return ch


_SEGMENTED = PerChar(_segmented)


def segment(text: str) -> str:
    """Text for the segmented index: CJK one token per character, symbols as words."""
    return text if text.isascii() else text.translate(_SEGMENTED)


def tool_text(tool_name: str | None, tool_calls_json: str | None) -> str | None:
    """What a `tool` role search looks at: the tool's name and its call arguments."""
    parts = [p for p in (tool_name, tool_calls_json) if p]
    return " ".join(parts) if parts else None


def aux_row(
    content: str | None, tool_name: str | None, tool_calls: str | None
) -> tuple[str | None, str | None] | None:
    """The (seg_text, tool_text) a message needs in messages_aux, or None for no row."""
    seg = segment(content) if content and needs_aux(content) else None
    tools = tool_text(tool_name, tool_calls)
    if seg is None and tools is None:
        return None
    return seg, tools
